/*
 * runtime.h -- internal controls of the pipeline (pipeline.c) that the
 * embedded loader (loader.c) uses.
 */
#ifndef POLYLOAD_RUNTIME_H
#define POLYLOAD_RUNTIME_H

#include "build/build.h"
#include "wire/wire.h"

/* Undo pl_pipeline_close (the embedded loader stops and restarts its
 * workers around pl_loader_set_state). */
void pl__pipeline_reopen(pl_pipeline *p);
/* End the pipeline at `step` (an evaluation pass ran out of documents
 * there): as if train_steps were `step`, unless that is already earlier. */
void pl__pipeline_end_at(pl_pipeline *p, int64_t step);
/* Let drivers plan up to `steps` steps past the step of a group's next unit
 * (0, the default: only a step some group's window admits).  Plans are made
 * in step order by one planner either way, so no plan or batch changes; the
 * embedded loader with more than one worker sets 1 (one plans while the
 * others build). */
void pl__pipeline_plan_ahead(pl_pipeline *p, int64_t steps);
/* Plan `ahead` steps past the step of a group's next unit, and ask again only
 * once no more than `low` are (a transport that moves steps in bursts:
 * pl_loader_want_steps).  pl__pipeline_plan_ahead(p, n) is (n, n). */
void pl__pipeline_plan_window(pl_pipeline *p, int64_t ahead, int64_t low);
/* After a PL_WORK_PLAN for `step` (next_plan_step): grant the steps from it
 * up to `ahead` past the least step a group builds next (at least 1, at most
 * to total_steps), to be added in order by pl_pipeline_add_step without
 * asking again.  Returns how many; 0 when `step` is not the one asked for. */
int64_t pl__pipeline_grant(pl_pipeline *p, int64_t step, int64_t ahead);
/* Hold a consumer's wake-up for up to `units` cheap units (<= 1: off; see
 * "Held wake-ups" in pipeline.c).  Only for drivers that call
 * pl_pipeline_get_work again after each pl_pipeline_complete, as the
 * loader's worker threads do: a held wake-up goes out there. */
void pl__pipeline_defer_wakes(pl_pipeline *p, int64_t units);

#endif
