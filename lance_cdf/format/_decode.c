/* Planning's two byte-level decoders in C (optional: lance_cdf.format falls back to numpy).

   range_segments(data) -> (starts, ends) | None
       A serialized RowIdSequence made only of Range segments: the segments' starts and
       ends as bytes of native-order uint64. None for any other shape (another segment
       kind, a repeated or unknown field, a length that does not match its bytes, a varint
       over 10 bytes, end < start): the caller then parses it with protobuf.

   u32_ipc_values(data) -> bytes | None
       An Arrow IPC file holding one non-null unsigned 32-bit column (the layout pylance
       writes for `.arrow` deletion files): the values of all its record batches, sorted
       ascending, as bytes of native-order uint32. None for anything else (other types,
       nulls, dictionaries, other codecs, big-endian, an inconsistent footer, zstd not
       found or failing): the caller then reads it with pyarrow, which reports damage.

   u32_ipc_bitmap(data) -> bytes | None
       The same values as a roaring bitmap in the portable serialization (duplicates
       dropped), for pyroaring's BitMap.deserialize.

   manifest_entries(data, start, end) -> ([(id, start, end), ...], [(start, end), ...]) | None
       The top level of the Manifest message in data[start:end]: each `fragments` record
       (field 2) as its DataFragment's id (field 1; 0 when absent, the last one when
       repeated) and the span of its bytes, and the spans of every other record. None
       where the parser could read it otherwise (a group, an unknown wire type, a field 2
       that is not length-delimited, an id that is not a varint, a record past `end`).

   same_bytes(a, b) -> bool
       Whether two buffers hold the same bytes (memcmp: a memoryview's == compares
       element by element, 4x slower than copying both).

   Every read is bounds-checked: garbage gives None, never a read outside `data`. The
   checks follow lance_cdf/format/deletions.py's `_read_ipc_file` and rowids.py's
   `_range_segments`, which tests/test_native_decode.py compares this file against. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- bounds-checked little-endian reads: out of range sets `bad`, returns 0 ---- */

typedef struct {
    const uint8_t *p;
    int64_t n;
    int bad;
} Buf;

static uint64_t rd(Buf *b, int64_t pos, int size) {
    if (pos < 0 || size > b->n || pos > b->n - size) {
        b->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = size - 1; i >= 0; i--) v = (v << 8) | b->p[pos + i];
    return v;
}
#define U8(b, pos) ((uint8_t)rd((b), (pos), 1))
#define U16(b, pos) ((uint16_t)rd((b), (pos), 2))
#define U32(b, pos) ((uint32_t)rd((b), (pos), 4))
#define I32(b, pos) ((int32_t)(uint32_t)rd((b), (pos), 4))
#define I64(b, pos) ((int64_t)rd((b), (pos), 8))

/* ---- range_segments ---- */

/* One varint at *pos (at most 10 bytes, inside [.., end)); -1 if none. */
static int varint(const uint8_t *p, int64_t *pos, int64_t end, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (*pos >= end) return -1;
        uint8_t byte = p[(*pos)++];
        v |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

static PyObject *range_segments(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = view.buf;
    int64_t n = view.len, pos = 0, count = 0;
    /* a segment takes at least 4 bytes (two tags, two lengths): bound the output */
    int64_t cap = n / 4 + 1;
    uint64_t *starts = malloc(cap * sizeof(uint64_t)), *ends = malloc(cap * sizeof(uint64_t));
    PyObject *result = NULL;
    if (!starts || !ends) {
        PyErr_NoMemory();
        goto done;
    }
    while (pos < n) {
        uint64_t tag, len, inner_tag, inner_len;
        /* RowIdSequence.segments (field 1, length-delimited) */
        if (varint(p, &pos, n, &tag) || tag != 10 || varint(p, &pos, n, &len)) goto shape;
        if (len > (uint64_t)(n - pos)) goto shape;
        int64_t seg_end = pos + (int64_t)len;
        /* U64Segment.range (field 1, length-delimited), the segment's only field */
        if (varint(p, &pos, seg_end, &inner_tag) || inner_tag != 10) goto shape;
        if (varint(p, &pos, seg_end, &inner_len) || inner_len != (uint64_t)(seg_end - pos))
            goto shape;
        uint64_t start = 0, end = 0;
        int have_start = 0, have_end = 0;
        while (pos < seg_end) {
            uint64_t field, value;
            if (varint(p, &pos, seg_end, &field) || varint(p, &pos, seg_end, &value)) goto shape;
            if (field == 8 && !have_start) {
                start = value;
                have_start = 1;
            } else if (field == 16 && !have_end) {
                end = value;
                have_end = 1;
            } else {
                goto shape; /* another field, or a repeated one (last wins: the parser's) */
            }
        }
        if (end < start || count >= cap) goto shape;
        starts[count] = start;
        ends[count] = end;
        count++;
    }
    {
        PyObject *s = PyBytes_FromStringAndSize((const char *)starts, count * 8);
        PyObject *e = PyBytes_FromStringAndSize((const char *)ends, count * 8);
        if (s && e) result = PyTuple_Pack(2, s, e);
        Py_XDECREF(s);
        Py_XDECREF(e);
    }
    goto done;
shape:
    result = Py_NewRef(Py_None);
done:
    free(starts);
    free(ends);
    PyBuffer_Release(&view);
    return result;
}

/* ---- u32_ipc_values ---- */

/* the position of the flatbuffer table an offset field at `ref` points to */
static int64_t table_at(Buf *b, int64_t ref) { return ref + U32(b, ref); }

/* absolute positions of fields 0..count-1 of the table at `pos` (0: absent) */
static void slots(Buf *b, int64_t pos, int count, int64_t *out) {
    int64_t vt = pos - I32(b, pos);
    int have = ((int)U16(b, vt) - 4) / 2;
    if (have > count) have = count;
    for (int i = 0; i < count; i++) {
        int64_t o = i < have ? U16(b, vt + 4 + 2 * i) : 0;
        out[i] = o ? pos + o : 0;
    }
}

/* libzstd's stable API, looked up at run time (no -dev headers needed to build). One
   decompression context, reused: ZSTD_decompress allocates and frees ~100 KB per call,
   most of the cost for a deletion file. Calls hold the GIL, so one context is enough. */
typedef void *(*zstd_create_fn)(void);
typedef size_t (*zstd_decompress_fn)(void *, void *, size_t, const void *, size_t);
typedef unsigned (*zstd_is_error_fn)(size_t);
static zstd_decompress_fn zstd_decompress;
static zstd_is_error_fn zstd_is_error;
static void *zstd_context;
static int zstd_tried;

static int zstd_load(void) {
    if (!zstd_tried) {
        zstd_tried = 1;
        void *lib = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            zstd_create_fn create = (zstd_create_fn)dlsym(lib, "ZSTD_createDCtx");
            zstd_decompress = (zstd_decompress_fn)dlsym(lib, "ZSTD_decompressDCtx");
            zstd_is_error = (zstd_is_error_fn)dlsym(lib, "ZSTD_isError");
            zstd_context = create ? create() : NULL;
            if (!zstd_decompress || !zstd_is_error || !zstd_context) zstd_decompress = NULL;
        }
    }
    return zstd_decompress != NULL;
}

static void insertion_sort(uint32_t *v, int64_t n) {
    for (int64_t i = 1; i < n; i++) {
        uint32_t x = v[i];
        int64_t j = i;
        while (j > 0 && v[j - 1] > x) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

static void sort_u32(uint32_t *v, int64_t n) {
    uint32_t *tmp = n < 64 ? NULL : malloc(n * sizeof(uint32_t));
    if (!tmp) { /* few values, or out of memory: in place */
        insertion_sort(v, n);
        return;
    }
    /* LSD radix sort, 4 passes of 8 bits (a pass is skipped where all share the digit) */
    uint32_t *src = v, *dst = tmp;
    for (int shift = 0; shift < 32; shift += 8) {
        int64_t counts[257] = {0};
        for (int64_t i = 0; i < n; i++) counts[((src[i] >> shift) & 0xFF) + 1]++;
        if (counts[((src[0] >> shift) & 0xFF) + 1] == n) continue; /* one digit: no pass */
        for (int d = 0; d < 256; d++) counts[d + 1] += counts[d];
        for (int64_t i = 0; i < n; i++) dst[counts[(src[i] >> shift) & 0xFF]++] = src[i];
        uint32_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != v) memcpy(v, src, n * sizeof(uint32_t));
    free(tmp);
}

enum { HEADER_RECORD_BATCH = 3, TYPE_INT = 2, CODEC_ZSTD = 1 };

/* One field, an unsigned 32-bit integer, no dictionary, no children, little-endian. */
static int schema_ok(Buf *b, int64_t schema) {
    int64_t s[2], f[6], t[2];
    slots(b, schema, 2, s);
    if (s[0] && (int16_t)U16(b, s[0]) != 0) return 0;
    if (!s[1]) return 0;
    int64_t fields = table_at(b, s[1]);
    if (U32(b, fields) != 1) return 0;
    slots(b, table_at(b, fields + 4), 6, f); /* name, nullable, type_type, type, dict, children */
    if (!f[2] || U8(b, f[2]) != TYPE_INT || f[4] || !f[3]) return 0;
    if (f[5] && U32(b, table_at(b, f[5]))) return 0;
    slots(b, table_at(b, f[3]), 2, t); /* bitWidth, is_signed */
    if (!t[0] || I32(b, t[0]) != 32) return 0;
    if (t[1] && U8(b, t[1])) return 0;
    return !b->bad;
}

/* the values of one body buffer appended at out[*count..]; 0: not the layout */
static int take_buffer(Buf *b, int64_t start, int64_t end, int compressed, int64_t rows,
                       uint32_t **out, int64_t *count, int64_t *cap) {
    const uint8_t *src = b->p + start;
    int64_t len = end - start;
    int64_t need = 4 * rows;
    uint8_t *scratch = NULL;
    if (compressed && len) {
        if (len < 8) return 0;
        int64_t size = I64(b, start);
        if (size == -1) {
            src += 8;
            len -= 8;
        } else {
            if (size < 0 || size < need || !zstd_load()) return 0;
            scratch = malloc(size ? size : 1);
            if (!scratch) return 0;
            size_t got = zstd_decompress(zstd_context, scratch, size, src + 8, len - 8);
            if (zstd_is_error(got) || (int64_t)got != size) {
                free(scratch);
                return 0;
            }
            src = scratch;
            len = size;
        }
    }
    if (len < need) {
        free(scratch);
        return 0;
    }
    if (*count + rows > *cap) {
        int64_t grown = (*count + rows) * 2;
        uint32_t *more = realloc(*out, grown * sizeof(uint32_t));
        if (!more) {
            free(scratch);
            return 0;
        }
        *out = more;
        *cap = grown;
    }
    for (int64_t i = 0; i < rows; i++) {
        const uint8_t *q = src + 4 * i;
        (*out)[*count + i] = q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    }
    *count += rows;
    free(scratch);
    return 1;
}

/* Sorted values as a roaring bitmap in the portable format (no run containers), which
   pyroaring's BitMap.deserialize reads in ~3 us, where building one from an array costs
   ~40 ns per value. Duplicates are dropped (the caller compares the count with the
   manifest's). Format: cookie 12346, container count, (key, cardinality - 1) per
   container, each container's byte offset, then each container: cardinality uint16
   values when <= 4096, else a 8192-byte bitset. */
static void put16(uint8_t *q, uint16_t v) { q[0] = v & 0xFF; q[1] = v >> 8; }
static void put32(uint8_t *q, uint32_t v) { put16(q, v & 0xFFFF); put16(q + 2, v >> 16); }

static PyObject *portable_roaring(const uint32_t *v, int64_t n) {
    /* the containers, then the distinct values of each */
    int64_t containers = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i && v[i] == v[i - 1]) continue;
        if (!i || (v[i] >> 16) != (v[i - 1] >> 16)) containers++;
    }
    int64_t *cards = calloc(containers ? containers : 1, sizeof(int64_t));
    if (!cards) return PyErr_NoMemory();
    int64_t c = -1, size = 8 + 8 * containers;
    for (int64_t i = 0; i < n; i++) {
        if (i && v[i] == v[i - 1]) continue;
        if (!i || (v[i] >> 16) != (v[i - 1] >> 16)) c++;
        cards[c]++;
    }
    for (c = 0; c < containers; c++) size += cards[c] <= 4096 ? 2 * cards[c] : 8192;
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (!out) {
        free(cards);
        return NULL;
    }
    uint8_t *q = (uint8_t *)PyBytes_AS_STRING(out);
    memset(q, 0, size);
    put32(q, 12346);
    put32(q + 4, (uint32_t)containers);
    int64_t at = 8 + 8 * containers, i = 0;
    for (c = 0; c < containers; c++) {
        uint16_t key = v[i] >> 16;
        put16(q + 8 + 4 * c, key);
        put16(q + 10 + 4 * c, (uint16_t)(cards[c] - 1));
        put32(q + 8 + 4 * containers + 4 * c, (uint32_t)at);
        int64_t written = 0;
        for (; i < n && (v[i] >> 16) == key; i++) {
            if (i && v[i] == v[i - 1]) continue;
            uint16_t low = v[i] & 0xFFFF;
            if (cards[c] <= 4096)
                put16(q + at + 2 * written, low);
            else
                q[at + low / 8] |= (uint8_t)(1u << (low % 8)); /* little-endian 64-bit words */
            written++;
        }
        at += cards[c] <= 4096 ? 2 * cards[c] : 8192;
    }
    free(cards);
    return out;
}

static PyObject *ipc_values(PyObject *arg, int roaring) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Buf buf = {view.buf, view.len, 0}, *b = &buf;
    int64_t size = view.len, count = 0, cap = 0;
    uint32_t *values = NULL;
    PyObject *result = NULL;
    if (size < 24 || memcmp(b->p, "ARROW1", 6) || memcmp(b->p + size - 6, "ARROW1", 6)) goto shape;
    int64_t footer_len = I32(b, size - 10), footer_pos = size - 10 - footer_len;
    if (footer_len <= 0 || footer_pos < 8) goto shape;
    int64_t footer[4]; /* version, schema, dictionaries, recordBatches */
    slots(b, table_at(b, footer_pos), 4, footer);
    if (b->bad || !footer[1] || (footer[2] && U32(b, table_at(b, footer[2])))) goto shape;
    if (!schema_ok(b, table_at(b, footer[1])) || !footer[3]) goto shape;
    int64_t batches = table_at(b, footer[3]);
    int64_t n_batches = U32(b, batches);
    if (b->bad || !n_batches) goto shape;
    for (int64_t i = 0; i < n_batches; i++) {
        int64_t block = batches + 4 + 24 * i;
        int64_t offset = I64(b, block), meta_len = I32(b, block + 8), body_len = I64(b, block + 16);
        int64_t body = offset + meta_len;
        if (b->bad || offset < 8 || meta_len < 8 || body_len < 0 || offset > size ||
            meta_len > size || body_len > size || body + body_len > footer_pos)
            goto shape;
        if (U32(b, offset) != 0xFFFFFFFFu || (int64_t)I32(b, offset + 4) + 8 > meta_len) goto shape;
        int64_t msg[4]; /* version, header_type, header, bodyLength */
        slots(b, table_at(b, offset + 8), 4, msg);
        if (b->bad || !msg[1] || U8(b, msg[1]) != HEADER_RECORD_BATCH || !msg[2]) goto shape;
        if (!msg[3] || I64(b, msg[3]) != body_len) goto shape;
        int64_t rb[5]; /* length, nodes, buffers, compression, variadicBufferCounts */
        slots(b, table_at(b, msg[2]), 5, rb);
        int64_t rows = rb[0] ? I64(b, rb[0]) : 0;
        if (b->bad || !rb[1] || !rb[2] || rows < 0) goto shape;
        if (rb[4] && U32(b, table_at(b, rb[4]))) goto shape;
        int64_t nodes = table_at(b, rb[1]), buffers = table_at(b, rb[2]);
        if (U32(b, nodes) != 1 || U32(b, buffers) != 2) goto shape;
        int64_t node_rows = I64(b, nodes + 4), nulls = I64(b, nodes + 12);
        int64_t start = I64(b, buffers + 4 + 16), length = I64(b, buffers + 4 + 24);
        if (b->bad || node_rows != rows || nulls) goto shape;
        if (rb[3]) {
            int64_t c[2]; /* codec (default LZ4_FRAME), method (default BUFFER) */
            slots(b, table_at(b, rb[3]), 2, c);
            if (b->bad || !c[0] || U8(b, c[0]) != CODEC_ZSTD || (c[1] && U8(b, c[1]) != 0))
                goto shape;
        }
        if (start < 0 || length < 0 || start > body_len || length > body_len - start ||
            (body | start) % 8 || rows > size)
            goto shape;
        if (!take_buffer(b, body + start, body + start + length, rb[3] != 0, rows, &values,
                         &count, &cap))
            goto shape;
    }
    if (count) sort_u32(values, count);
    result = roaring ? portable_roaring(values, count)
                     : PyBytes_FromStringAndSize((const char *)values, count * 4);
    goto done;
shape:
    result = Py_NewRef(Py_None);
done:
    free(values);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *u32_ipc_values(PyObject *self, PyObject *arg) {
    (void)self;
    return ipc_values(arg, 0);
}

static PyObject *u32_ipc_bitmap(PyObject *self, PyObject *arg) {
    (void)self;
    return ipc_values(arg, 1);
}

/* ---- manifest_entries ---- */

/* Step over the value of a field of wire type `wt` at *pos; -1 if it runs past `end`
   or the wire type is a group (3, 4) or undefined (6, 7). */
static int skip_value(const uint8_t *p, int64_t *pos, int64_t end, int wt) {
    uint64_t v;
    switch (wt) {
    case 0:
        return varint(p, pos, end, &v);
    case 1:
        if (end - *pos < 8) return -1;
        *pos += 8;
        return 0;
    case 5:
        if (end - *pos < 4) return -1;
        *pos += 4;
        return 0;
    case 2:
        if (varint(p, pos, end, &v) || v > (uint64_t)(end - *pos)) return -1;
        *pos += (int64_t)v;
        return 0;
    default:
        return -1;
    }
}

/* One tag at *pos: its field number (1 .. 2^29-1) and wire type; -1 if none. */
static int read_tag(const uint8_t *p, int64_t *pos, int64_t end, uint64_t *field, int *wt) {
    uint64_t tag;
    if (varint(p, pos, end, &tag) || tag > 0xFFFFFFFFu || (tag >> 3) == 0) return -1;
    *field = tag >> 3;
    *wt = (int)(tag & 7);
    return 0;
}

/* The id of the DataFragment in p[start, end); -1 if its top level does not read. */
static int fragment_id(const uint8_t *p, int64_t pos, int64_t end, uint64_t *id) {
    *id = 0;
    while (pos < end) {
        uint64_t field;
        int wt;
        if (read_tag(p, &pos, end, &field, &wt)) return -1;
        if (field == 1) {
            if (wt != 0 || varint(p, &pos, end, id)) return -1;
        } else if (skip_value(p, &pos, end, wt)) {
            return -1;
        }
    }
    return 0;
}

static PyObject *manifest_entries(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &start, &end)) return NULL;
    PyObject *frags = PyList_New(0), *rest = PyList_New(0), *result = NULL;
    const uint8_t *p = view.buf;
    int64_t pos = start;
    if (!frags || !rest) goto done;
    if (start < 0 || end < start || end > view.len) goto shape;
    while (pos < end) {
        int64_t at = pos;
        uint64_t field, id, len;
        int wt;
        PyObject *item;
        if (read_tag(p, &pos, end, &field, &wt)) goto shape;
        if (field == 2) {
            if (wt != 2 || varint(p, &pos, end, &len) || len > (uint64_t)(end - pos)) goto shape;
            if (fragment_id(p, pos, pos + (int64_t)len, &id)) goto shape;
            item = Py_BuildValue("(KLL)", (unsigned long long)id, (long long)pos,
                                 (long long)(pos + (int64_t)len));
            pos += (int64_t)len;
            if (!item || PyList_Append(frags, item)) {
                Py_XDECREF(item);
                goto done;
            }
        } else {
            if (skip_value(p, &pos, end, wt)) goto shape;
            item = Py_BuildValue("(LL)", (long long)at, (long long)pos);
            if (!item || PyList_Append(rest, item)) {
                Py_XDECREF(item);
                goto done;
            }
        }
        Py_DECREF(item);
    }
    result = PyTuple_Pack(2, frags, rest);
    goto done;
shape:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(frags);
    Py_XDECREF(rest);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *same_bytes(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer a, b;
    if (!PyArg_ParseTuple(args, "y*y*", &a, &b)) return NULL;
    int same = a.len == b.len && memcmp(a.buf, b.buf, (size_t)a.len) == 0;
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return PyBool_FromLong(same);
}

static PyMethodDef methods[] = {
    {"manifest_entries", manifest_entries, METH_VARARGS, "a Manifest's fragment records"},
    {"same_bytes", same_bytes, METH_VARARGS, "whether two buffers hold the same bytes"},
    {"range_segments", range_segments, METH_O, "(starts, ends) of a Range-only RowIdSequence"},
    {"u32_ipc_values", u32_ipc_values, METH_O, "sorted values of a one-column uint32 IPC file"},
    {"u32_ipc_bitmap", u32_ipc_bitmap, METH_O, "the same values as a portable roaring bitmap"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_decode", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__decode(void) { return PyModule_Create(&module); }
