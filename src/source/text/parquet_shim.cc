/*
 * parquet_shim.cc -- Parquet files for raw text sources (type: parquet),
 * through Apache Arrow's C++ Parquet library (libparquet, libarrow: the ones
 * the pyarrow wheel ships; CMake finds them from pyarrow's directories).
 *
 * The only file that sees Arrow, behind the C interface of parquet_shim.h;
 * built when PL_WITH_PARQUET finds the libraries.  No exception leaves this
 * file: every call catches and turns it into a PL_E* code and a message
 * naming the file (and the row group and the column chunk's byte offset
 * where one is being read).  No Python is involved.
 *
 * Opening reads the footer only (parquet::ParquetFileReader::OpenFile): the
 * row groups' row counts are the record index (no sidecar), and the column
 * is checked there: a top-level, non-repeated BYTE_ARRAY column annotated
 * as a string (UTF8 / String logical type).  The column chunks' byte ranges
 * are checked against the file's size.  A row group is decoded only when
 * asked (pl__pq_read_group), with the low-level ByteArray column reader,
 * into malloc'd buffers the C side owns.  A handle is not safe for
 * concurrent calls (the caller serializes them).  A row group is decoded
 * only from the file that was opened, as it was: one whose size or mtime
 * changed since (fstat of the descriptor opened) is PL_ETRUNC (shorter) or
 * PL_EIO, and Arrow's I/O failures are PL_EIO, not a damaged row.
 */
#include <arrow/io/file.h>
#include <parquet/api/reader.h>
#include <parquet/exception.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

extern "C" {
#include "config/config.h"
#include "source/text/parquet_shim.h"
}

struct pl__pqfile {
    std::shared_ptr<arrow::io::ReadableFile> file; /* the file opened (fstat) */
    std::unique_ptr<parquet::ParquetFileReader> reader;
    std::shared_ptr<parquet::FileMetaData> md;
    std::string path; /* as messages name it */
    int cached = 0;   /* a remote object's cache file (see pl__pq_open) */
    int column = -1;
    int16_t max_def = 0;
    int64_t size = 0;      /* at open */
    int64_t mtime_ns = 0;  /* at open */
};

namespace {

/* Byte offset of row group g's column chunk (its first page), or -1. */
int64_t chunk_offset(const pl__pqfile *h, int g) {
    try {
        auto rg = h->md->RowGroup(g);
        auto cc = rg->ColumnChunk(h->column);
        int64_t off = cc->data_page_offset();
        if (cc->has_dictionary_page() && cc->dictionary_page_offset() > 0 &&
            cc->dictionary_page_offset() < off)
            off = cc->dictionary_page_offset();
        return off;
    } catch (...) {
        return -1;
    }
}

} // namespace

extern "C" int pl__pq_open(const char *local, const char *name, int cached,
                           const char *column, pl__pqfile **out, int64_t *n_groups,
                           int64_t **group_rows, char *err, size_t errcap) {
    /* local: the file read; path: what messages call it */
    const char *path = name ? name : local;
    *out = nullptr;
    *n_groups = 0;
    *group_rows = nullptr;
    struct stat st;
    if (stat(local, &st) != 0) {
        pl__fmt(err, errcap, "%s: cannot open: %s", path, std::strerror(errno));
        return errno == ENOENT ? PL_ENOENT : PL_EIO;
    }
    const int64_t size = static_cast<int64_t>(st.st_size);
    /* The format's frame: "PAR1" at both ends, the footer's length before the
       last one.  A file cut short loses its footer: say so plainly. */
    {
        FILE *fp = std::fopen(local, "rb");
        unsigned char head[4] = {0}, tail[8] = {0};
        int ok = fp && size >= 12 && std::fread(head, 1, 4, fp) == 4 &&
                 std::fseek(fp, -8, SEEK_END) == 0 && std::fread(tail, 1, 8, fp) == 8;
        if (fp) std::fclose(fp);
        if (!ok || std::memcmp(head, "PAR1", 4) != 0) {
            pl__fmt(err, errcap,
                    "%s: not a Parquet file (%lld bytes, no \"PAR1\" magic at byte "
                    "offset 0)",
                    path, static_cast<long long>(size));
            return PL_ERECORD;
        }
        if (std::memcmp(tail + 4, "PAR1", 4) != 0) {
            pl__fmt(err, errcap,
                    "%s: truncated Parquet file: no \"PAR1\" footer magic at byte offset "
                    "%lld (the end of the file): the footer is missing",
                    path, static_cast<long long>(size - 4));
            return PL_ETRUNC;
        }
        uint32_t flen;
        std::memcpy(&flen, tail, 4);
        if (static_cast<int64_t>(flen) > size - 12) {
            pl__fmt(err, errcap,
                    "%s: corrupt Parquet footer: its length %u (at byte offset %lld) is "
                    "more than the file holds",
                    path, flen, static_cast<long long>(size - 8));
            return PL_ERECORD;
        }
    }
    pl__pqfile *h = new (std::nothrow) pl__pqfile;
    if (!h) {
        pl__fmt(err, errcap, "out of memory");
        return PL_ENOMEM;
    }
    int64_t *rows = nullptr;  // freed on every failure, the throwing ones included
    try {
        h->path = path;
        h->cached = cached;
        h->file = arrow::io::ReadableFile::Open(local).ValueOrDie();
        {
            struct stat fst;
            if (fstat(h->file->file_descriptor(), &fst) == 0) {
                h->size = static_cast<int64_t>(fst.st_size);
                h->mtime_ns = static_cast<int64_t>(fst.st_mtim.tv_sec) * 1000000000 +
                              fst.st_mtim.tv_nsec;
            }
        }
        h->reader = parquet::ParquetFileReader::Open(h->file);
        h->md = h->reader->metadata();
        const parquet::SchemaDescriptor *schema = h->md->schema();
        std::string names;
        for (int i = 0; i < schema->num_columns(); i++) {
            const parquet::ColumnDescriptor *c = schema->Column(i);
            std::string dotted = c->path()->ToDotString();
            if (i < 8) names += (i ? ", " : "") + dotted;
            if (dotted == column) h->column = i;
        }
        if (schema->num_columns() > 8) names += ", ...";
        if (h->column < 0) {
            pl__fmt(err, errcap, "%s: no column '%s' in the file's schema (columns: %s)",
                    path, column, names.empty() ? "none" : names.c_str());
            delete h;
            return PL_ERECORD;
        }
        const parquet::ColumnDescriptor *c = schema->Column(h->column);
        const auto &lt = c->logical_type();
        const bool is_string =
            c->physical_type() == parquet::Type::BYTE_ARRAY &&
            ((lt && lt->is_string()) || c->converted_type() == parquet::ConvertedType::UTF8);
        if (!is_string || c->max_repetition_level() > 0 ||
            schema->GetColumnRoot(h->column) != c->schema_node().get()) {
            pl__fmt(err, errcap,
                    "%s: column '%s' is %s%s, not a string column (a top-level BYTE_ARRAY "
                    "column of logical type String)",
                    path, column, c->max_repetition_level() > 0 ? "a repeated " : "",
                    (parquet::TypeToString(c->physical_type()) +
                     (lt && !lt->is_none() ? " (" + lt->ToString() + ")" : std::string()))
                        .c_str());
            delete h;
            return PL_ERECORD;
        }
        h->max_def = c->max_definition_level();
        const int ng = h->md->num_row_groups();
        rows = static_cast<int64_t *>(pl__calloc(ng ? (size_t)ng : 1, sizeof(int64_t)));
        if (!rows) {
            delete h;
            pl__fmt(err, errcap, "out of memory");
            return PL_ENOMEM;
        }
        for (int g = 0; g < ng; g++) {
            auto rg = h->md->RowGroup(g);
            rows[g] = rg->num_rows();
            if (rows[g] == 0) continue; /* never read (pyarrow writes one for an empty table,
                                           with data_page_offset 0) */
            auto cc = rg->ColumnChunk(h->column);
            int64_t off = chunk_offset(h, g);
            int64_t len = cc->total_compressed_size();
            if (rows[g] < 0 || off < 4 || len < 0 || off > size - 8 || len > size - 8 - off) {
                pl__fmt(err, errcap,
                        "%s: row group %d: corrupt footer: column '%s' chunk at byte "
                        "offset %lld, %lld bytes, %lld rows, outside the file's %lld "
                        "bytes",
                        path, g, column, static_cast<long long>(off),
                        static_cast<long long>(len), static_cast<long long>(rows[g]),
                        static_cast<long long>(size));
                std::free(rows);
                delete h;
                return PL_ERECORD;
            }
        }
        *out = h;
        *n_groups = ng;
        *group_rows = rows;
        return PL_OK;
    } catch (const std::exception &e) {
        pl__fmt(err, errcap, "%s: cannot read the Parquet footer: %s", path, e.what());
    } catch (...) {
        pl__fmt(err, errcap, "%s: cannot read the Parquet footer", path);
    }
    std::free(rows);
    delete h;
    return PL_ERECORD;
}

extern "C" int pl__pq_read_group(pl__pqfile *h, int64_t g, int64_t rows, char **data,
                                 uint64_t **offsets, uint8_t **valid, char *err,
                                 size_t errcap) {
    *data = nullptr;
    *offsets = nullptr;
    *valid = nullptr;
    uint64_t *o = static_cast<uint64_t *>(pl__realloc_array(nullptr, (size_t)rows + 1, sizeof(uint64_t)));
    uint8_t *v = static_cast<uint8_t *>(pl__malloc((size_t)rows));
    size_t cap = 1 << 16, len = 0;
    char *d = static_cast<char *>(pl__malloc(cap));
    if (!o || !v || !d) {
        std::free(o), std::free(v), std::free(d);
        pl__fmt(err, errcap, "%s: row group %lld: out of memory", h->path.c_str(),
                static_cast<long long>(g));
        return PL_ENOMEM;
    }
    int64_t row = 0;
    /* The footer was read at open: a file changed since then (cut short, or rewritten
       in place; one replaced by a rename is still the file opened) is not decoded as
       if it were damaged data. */
    struct stat st;
    if (h->file && !h->cached && fstat(h->file->file_descriptor(), &st) == 0) {
        const int64_t now = static_cast<int64_t>(st.st_size);
        const int64_t mt =
            static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
        if (now != h->size || mt != h->mtime_ns) {
            std::free(o), std::free(v), std::free(d);
            pl__fmt(err, errcap,
                    "the file changed since it was opened (%lld bytes then, %lld now%s): "
                    "its row groups are no longer the ones its footer described",
                    static_cast<long long>(h->size), static_cast<long long>(now),
                    now == h->size ? ", modified in place" : "");
            return now < h->size ? PL_ETRUNC : PL_EIO;
        }
    }
    try {
        auto rg = h->reader->RowGroup(static_cast<int>(g));
        auto col = rg->Column(h->column);
        auto *br = static_cast<parquet::ByteArrayReader *>(col.get());
        const int64_t batch = 1024;
        std::vector<int16_t> def(batch);
        std::vector<parquet::ByteArray> vals(batch);
        o[0] = 0;
        while (br->HasNext() && row < rows) {
            int64_t want = rows - row < batch ? rows - row : batch, got_vals = 0;
            int64_t levels = br->ReadBatch(want, def.data(), nullptr, vals.data(), &got_vals);
            if (levels <= 0) break;
            int64_t vi = 0;
            for (int64_t i = 0; i < levels; i++) {
                const bool present = h->max_def == 0 || def[i] == h->max_def;
                v[row] = present;
                if (present) {
                    if (vi >= got_vals) throw parquet::ParquetException("fewer values than levels");
                    const parquet::ByteArray &b = vals[vi++];
                    while (cap - len < b.len) {
                        char *nd = static_cast<char *>(pl__realloc_array(d, cap, 2));
                        if (!nd) throw std::bad_alloc();
                        d = nd;
                        cap *= 2;
                    }
                    if (b.len) std::memcpy(d + len, b.ptr, b.len);
                    len += b.len;
                }
                o[++row] = len;
            }
        }
        if (row != rows) {
            pl__fmt(err, errcap, "the column chunk holds %lld values, the footer says %lld rows",
                    static_cast<long long>(row), static_cast<long long>(rows));
            std::free(o), std::free(v), std::free(d);
            return PL_ERECORD;
        }
    } catch (const std::bad_alloc &) {
        std::free(o), std::free(v), std::free(d);
        pl__fmt(err, errcap, "%s: row group %lld: out of memory", h->path.c_str(),
                static_cast<long long>(g));
        return PL_ENOMEM;
    } catch (const parquet::ParquetStatusException &e) {
        /* Arrow's I/O failed (not the bytes' decoding): an I/O error, not a bad row. */
        std::free(o), std::free(v), std::free(d);
        std::string m = e.what();
        for (char &ch : m)
            if (ch == '\n') ch = ' ';
        pl__fmt(err, errcap, "cannot read the column chunk (near row %lld of the group): %s",
                static_cast<long long>(row), m.c_str());
        return e.status().IsIOError() ? PL_EIO : PL_ERECORD;
    } catch (const std::exception &e) {
        std::free(o), std::free(v), std::free(d);
        /* The caller names the file, the row and the chunk's offset. */
        std::string m = e.what();
        for (char &ch : m)
            if (ch == '\n') ch = ' ';
        while (!m.empty() && m.back() == ' ') m.pop_back();
        pl__fmt(err, errcap, "cannot decode the column chunk (near row %lld of the group): %s",
                static_cast<long long>(row), m.c_str());
        return PL_ERECORD;
    }
    *data = d;
    *offsets = o;
    *valid = v;
    return PL_OK;
}

extern "C" int64_t pl__pq_chunk_offset(const pl__pqfile *h, int64_t g) {
    return chunk_offset(h, static_cast<int>(g));
}

extern "C" int pl__pq_chunk_range(const pl__pqfile *h, int64_t g, int64_t *offset,
                                  int64_t *len) {
    try {
        const int64_t off = chunk_offset(h, static_cast<int>(g));
        int64_t n = h->md->RowGroup(static_cast<int>(g))->ColumnChunk(h->column)
                        ->total_compressed_size();
        if (off < 0 || n < 0 || off > h->size) return -1;
        /* Arrow reads up to 100 bytes (its kMaxDictHeaderSize) past a chunk of
           a file from an old parquet-mr (PARQUET-816); ask for them always. */
        n += 100;
        if (n > h->size - off) n = h->size - off;
        *offset = off;
        *len = n;
        return 0;
    } catch (...) {
        return -1;
    }
}

extern "C" void pl__pq_close(pl__pqfile *h) {
    try {
        delete h;
    } catch (...) {
    }
}
