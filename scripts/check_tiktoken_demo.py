#!/usr/bin/env python3
"""Check the tiktoken tokenizer on every document of the demo corpus (data/raw/*.jsonl,
`make corpus`): data/tokenizer.json converted to a .tiktoken file (polyload prepare
tiktoken), a jsonl source with `tokenizer: {type: tiktoken, pat_str: r50k_base}` and
eos_id 0 must give tiktoken's own encode_ordinary_batch ids plus the eos for every
document, and those ids must equal Hugging Face tokenizers' for the tokenizer.json.
Records every tokenizer refuses (empty documents) are counted, not compared.

    .venv/bin/python scripts/check_tiktoken_demo.py
"""
import tempfile
TIKTOKEN = tempfile.mkdtemp(prefix="pltik.") + "/demo.tiktoken"
import json, os, sys, time
import numpy as np
os.environ["RAYON_NUM_THREADS"] = "1"
from polyload import _core
from polyload._tiktoken import tokenizer_json_to_tiktoken
from tokenizers import Tokenizer
import tiktoken, tiktoken_ext.openai_public as op
tokenizer_json_to_tiktoken("data/tokenizer.json", TIKTOKEN)
ranks = tiktoken.load.load_tiktoken_bpe(TIKTOKEN)
enc = tiktoken.Encoding("demo", pat_str=op.r50k_pat_str, mergeable_ranks=ranks, special_tokens={})
hf = Tokenizer.from_file("data/tokenizer.json")
total = diff_hf = bad_total = 0
for name in sorted(n for n in os.listdir("data/raw") if n.endswith(".jsonl")):
    path = os.path.join("data/raw", name)
    texts = []
    for l in open(path, "rb"):
        if not l.strip():
            continue
        try:
            texts.append(json.loads(l.decode("utf-8"))["text"])
        except UnicodeDecodeError:
            texts.append("")  # the source refuses the record (invalid UTF-8), as it should
    print(name, "empty documents (refused by every tokenizer):", sum(not t for t in texts))
    cfg = {"seed": 1, "seq_length": 2048, "global_batch_size": 8, "micro_batch_size": 8,
           "train_steps": 1, "topology": {"dp": 1},
           "sources": [{"name": "s", "type": "jsonl", "path": path, "eos_id": 0, "index": "memory",
                        "tokenizer": {"type": "tiktoken", "path": TIKTOKEN,
                                      "pat_str": "r50k_base"}}]}
    src = _core.Config.parse_string(json.dumps(cfg)).open_source(0)
    want = enc.encode_ordinary_batch(texts, num_threads=1)
    ref = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    bad = 0
    for d, ids in enumerate(want):
        if not texts[d]:
            continue  # refused by the source (empty, or invalid UTF-8), as by any tokenizer
        if np.asarray(src.read(d)).tolist() != ids + [0]:
            bad += 1
        diff_hf += ids != ref[d]
    total += len(texts)
    bad_total += bad
    print(name, len(texts), "documents, mismatches vs encode_ordinary_batch:", bad, flush=True)
print("total", total, "documents; tiktoken vs tokenizers differ on", diff_hf)
if diff_hf or bad_total:
    sys.exit(1)
