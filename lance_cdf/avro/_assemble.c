/*
 * lance_cdf.avro._assemble: the encoder's last step in C.
 *
 * encode.py encodes every field of a batch of records column by column, as "parts"; this
 * module joins the parts record by record into one binary column (each record's bytes:
 * part 0's bytes of that record, then part 1's, ...). In numpy that step costs several
 * whole-batch copies, masks and a join; here it is two passes over the records.
 *
 * concat(n, parts, allocate) -> (offsets, data): `parts` is a sequence of
 *   (0, m, width, step, lens)   fixed-width rows: record i's bytes start at m + i * step
 *                               (step 0: the same bytes for every record), its length is
 *                               lens[i] (int64, None: width);
 *   (1, offsets, data, valid)   variable-width: record i's bytes are
 *                               data[offsets[i]:offsets[i + 1]] (int64 offsets), none
 *                               where valid[i] (uint8, None: all valid) is 0.
 * It returns the int64 offsets (n + 1) of the joined column as bytes, and its data in the
 * writable buffer `allocate(size)` returns (pyarrow's allocator: its pages are reused,
 * where a fresh bytes object of tens of MB is zeroed by the kernel page by page).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int kind; /* 0 fixed, 1 variable */
    Py_buffer a, b, c; /* fixed: m, lens; variable: offsets, data, valid */
    int has_b, has_c;
    Py_ssize_t width, step;
} Part;

static void part_release(Part *p) {
    if (p->a.obj) PyBuffer_Release(&p->a);
    if (p->has_b && p->b.obj) PyBuffer_Release(&p->b);
    if (p->has_c && p->c.obj) PyBuffer_Release(&p->c);
}

static int get(PyObject *obj, Py_buffer *view, int *has) {
    if (obj == Py_None) return 0;
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE)) return -1;
    if (has) *has = 1;
    return 0;
}

static int part_get(PyObject *tuple, Py_ssize_t n, Py_ssize_t k, Part *p) {
    int kind;
    PyObject *x, *y, *z;
    memset(p, 0, sizeof *p);
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) < 1) goto bad;
    kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(tuple, 0));
    p->kind = kind;
    if (kind == 0) {
        PyObject *lens;
        if (!PyArg_ParseTuple(tuple, "iOnnO", &kind, &x, &p->width, &p->step, &lens)) return -1;
        if (PyObject_GetBuffer(x, &p->a, PyBUF_SIMPLE) || get(lens, &p->b, &p->has_b)) return -1;
        if (p->width < 0 || p->step < 0 ||
            (n && p->a.len < (n - 1) * p->step + p->width) ||
            (p->has_b && p->b.len != n * (Py_ssize_t)sizeof(int64_t))) {
            PyErr_Format(PyExc_ValueError, "part %zd: fixed rows do not fit their buffers", k);
            return -1;
        }
        if (p->has_b) {
            const int64_t *lens_ = p->b.buf;
            for (Py_ssize_t i = 0; i < n; i++)
                if (lens_[i] < 0 || lens_[i] > p->width) {
                    PyErr_Format(PyExc_ValueError, "part %zd: record %zd's length %lld is "
                                 "outside 0..%zd", k, i, (long long)lens_[i], p->width);
                    return -1;
                }
        }
        return 0;
    }
    if (kind == 1) {
        if (!PyArg_ParseTuple(tuple, "iOOO", &kind, &x, &y, &z)) return -1;
        if (PyObject_GetBuffer(x, &p->a, PyBUF_SIMPLE)) return -1;
        p->has_b = 1;
        if (PyObject_GetBuffer(y, &p->b, PyBUF_SIMPLE) || get(z, &p->c, &p->has_c)) return -1;
        if (p->a.len != (n + 1) * (Py_ssize_t)sizeof(int64_t) ||
            (p->has_c && p->c.len != n)) {
            PyErr_Format(PyExc_ValueError, "part %zd: %zd offset bytes for %zd records", k,
                         p->a.len, n);
            return -1;
        }
        const int64_t *o = p->a.buf;
        for (Py_ssize_t i = 0; i < n; i++)
            if (o[i] < 0 || o[i + 1] < o[i] || o[i + 1] > p->b.len) {
                PyErr_Format(PyExc_ValueError, "part %zd: record %zd's offsets %lld..%lld are "
                             "outside its %zd data bytes", k, i, (long long)o[i],
                             (long long)o[i + 1], p->b.len);
                return -1;
            }
        return 0;
    }
bad:
    PyErr_Format(PyExc_ValueError, "part %zd: not a (0, ...) or (1, ...) tuple", k);
    return -1;
}

static inline Py_ssize_t part_len(const Part *p, Py_ssize_t i) {
    if (p->kind == 0) return p->has_b ? (Py_ssize_t)((const int64_t *)p->b.buf)[i] : p->width;
    if (p->has_c && !((const uint8_t *)p->c.buf)[i]) return 0;
    const int64_t *o = p->a.buf;
    return (Py_ssize_t)(o[i + 1] - o[i]);
}

static inline const char *part_bytes(const Part *p, Py_ssize_t i) {
    if (p->kind == 0) return (const char *)p->a.buf + i * p->step;
    return (const char *)p->b.buf + ((const int64_t *)p->a.buf)[i];
}

static PyObject *concat(PyObject *self, PyObject *args) {
    Py_ssize_t n, np_ = 0, filled = 0;
    PyObject *seq, *parts_obj, *allocate, *offsets = NULL, *data = NULL, *result = NULL;
    Py_buffer out_view = {0};
    Part *parts = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "nOO", &n, &parts_obj, &allocate) || n < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    seq = PySequence_Fast(parts_obj, "parts must be a sequence");
    if (!seq) return NULL;
    np_ = PySequence_Fast_GET_SIZE(seq);
    parts = PyMem_Calloc(np_ ? np_ : 1, sizeof(Part));
    if (!parts) {
        PyErr_NoMemory();
        goto out;
    }
    for (; filled < np_; filled++)
        if (part_get(PySequence_Fast_GET_ITEM(seq, filled), n, filled, &parts[filled])) {
            filled++; /* release what it got */
            goto out;
        }
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int64_t));
    if (!offsets) goto out;
    int64_t *off = (int64_t *)PyBytes_AS_STRING(offsets);
    off[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t len = 0;
        for (Py_ssize_t k = 0; k < np_; k++) len += part_len(&parts[k], i);
        off[i + 1] = off[i] + len;
    }
    data = PyObject_CallFunction(allocate, "n", (Py_ssize_t)off[n]);
    if (!data || PyObject_GetBuffer(data, &out_view, PyBUF_WRITABLE)) goto out;
    if (out_view.len < (Py_ssize_t)off[n]) {
        PyErr_SetString(PyExc_ValueError, "allocate(size) returned a smaller buffer");
        goto out;
    }
    char *dst = out_view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        for (Py_ssize_t k = 0; k < np_; k++) {
            Py_ssize_t len = part_len(&parts[k], i);
            memcpy(dst, part_bytes(&parts[k], i), (size_t)len);
            dst += len;
        }
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(2, offsets, data);
out:
    if (out_view.obj) PyBuffer_Release(&out_view);
    for (Py_ssize_t k = 0; k < filled; k++) part_release(&parts[k]);
    PyMem_Free(parts);
    Py_DECREF(seq);
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    return result;
}

static PyMethodDef methods[] = {
    {"concat", concat, METH_VARARGS, "concat(n, parts, allocate) -> (int64 offsets as bytes, data from allocate(size))"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_assemble", NULL, -1, methods};

PyMODINIT_FUNC PyInit__assemble(void) { return PyModule_Create(&module); }
