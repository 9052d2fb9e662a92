/* The two byte-level readers planning needs to be fast on tables with long histories,
   in C, each tested against the library that is the reference (protobuf; see
   test_format). Optional: where no C compiler is present, lance_cdf.format
   parses with protobuf alone (same results, slower on aged tables: bench_core).

   range_segments(data) -> (starts, ends) | None
       A serialized RowIdSequence made only of Range segments: the segments' starts and
       ends as bytes of native-order uint64. None for any other shape (another segment
       kind, a repeated or unknown field, a length that does not match its bytes, a varint
       over 10 bytes, end < start): the caller then parses it with protobuf. A scattered
       merge_insert leaves one single-row Range per rewritten row (megabytes of them in
       the manifests of a table with that history): protobuf's objects cost about a
       thousand times what this does per segment (docs/benchmarks.md, "Reading the format").

   manifest_entries(data, start, end) -> ([(id, start, end), ...], [(start, end), ...]) | None
       The top level of the Manifest message in data[start:end]: each `fragments` record
       (field 2) as its DataFragment's id (field 1; 0 when absent, the last one when
       repeated) and the span of its bytes, and the spans of every other record. None
       where the parser could read it otherwise (a group, an unknown wire type, a field 2
       that is not length-delimited, an id that is not a varint, a record past `end`).
       The entries stay bytes of the file until looked into: a diff of two manifests
       parses only the entries a commit changed.

   same_bytes(a, b) -> bool
       Whether two buffers hold the same bytes (memcmp: a memoryview's == compares
       element by element, slower than copying both; docs/benchmarks.md, "Reading the format").

   Every read is bounds-checked: garbage gives None, never a read outside `data`. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_decode", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__decode(void) { return PyModule_Create(&module); }
