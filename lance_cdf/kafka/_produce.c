/*
 * lance_cdf.kafka._produce: the publisher's per-record loop in C.
 *
 * A Kafka producer (librdkafka) that takes a whole batch of records as Arrow-style
 * columns (int32 offsets + data bytes + an optional uint8 validity mask per binary
 * column, int32 partitions) and enqueues them in one call, without a Python object per
 * record. Python's confluent-kafka `produce()` costs ~4 us per record with three headers;
 * this loop costs librdkafka's own enqueue.
 *
 * librdkafka is not linked at build time: `load(path)` dlopens the copy that
 * confluent-kafka already ships (or the system's), so building needs no -dev headers.
 * The few declarations below are librdkafka's public, stable C ABI.
 *
 * Delivery: failures are counted (with the first one's text) from the delivery callback,
 * which runs inside poll()/flush() on the calling thread; `take_failures()` returns and
 * resets them. Nothing is retried here beyond librdkafka's own retries: the caller fails
 * the micro-batch on any failure, as with the Python producer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

/* --- librdkafka's C ABI (the part used here) ------------------------------------ */
typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_error_s rd_kafka_error_t;
typedef struct {
    int err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;

enum { VT_END, VT_TOPIC, VT_RKT, VT_PARTITION, VT_VALUE, VT_KEY, VT_OPAQUE, VT_MSGFLAGS,
       VT_TIMESTAMP, VT_HEADER, VT_HEADERS };
typedef struct {
    int vtype;
    union {
        const char *cstr;
        rd_kafka_topic_t *rkt;
        int i;
        int32_t i32;
        int64_t i64;
        struct { const void *ptr; size_t size; } mem;
        struct { const char *name; const void *val; ssize_t size; } header;
        void *ptr;
        char _pad[64];
    } u;
} rd_kafka_vu_t;

#define RD_PRODUCER 0
#define RD_CONF_OK 0
#define MSG_F_COPY 0x2
#define ERR_QUEUE_FULL (-184)

typedef void (*dr_cb_t)(rd_kafka_t *, const rd_kafka_message_t *, void *);

static struct {
    int loaded;
    rd_kafka_conf_t *(*conf_new)(void);
    int (*conf_set)(rd_kafka_conf_t *, const char *, const char *, char *, size_t);
    void (*conf_set_dr_msg_cb)(rd_kafka_conf_t *, dr_cb_t);
    void (*conf_set_opaque)(rd_kafka_conf_t *, void *);
    void (*conf_destroy)(rd_kafka_conf_t *);
    rd_kafka_t *(*kafka_new)(int, rd_kafka_conf_t *, char *, size_t);
    void (*kafka_destroy)(rd_kafka_t *);
    int (*poll)(rd_kafka_t *, int);
    int (*flush)(rd_kafka_t *, int);
    int (*outq_len)(rd_kafka_t *);
    const char *(*err2str)(int);
    rd_kafka_topic_t *(*topic_new)(rd_kafka_t *, const char *, void *);
    void (*topic_destroy)(rd_kafka_topic_t *);
    rd_kafka_error_t *(*produceva)(rd_kafka_t *, const rd_kafka_vu_t *, size_t);
    int (*error_code)(const rd_kafka_error_t *);
    void (*error_destroy)(rd_kafka_error_t *);
} rk;

static PyObject *load(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    if (rk.loaded) Py_RETURN_NONE;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return PyErr_Format(PyExc_OSError, "cannot load librdkafka: %s", dlerror());
#define SYM(field, name)                                                               \
    do {                                                                               \
        *(void **)(&rk.field) = dlsym(lib, name);                                      \
        if (!rk.field) return PyErr_Format(PyExc_OSError, "librdkafka lacks %s", name); \
    } while (0)
    SYM(conf_new, "rd_kafka_conf_new");
    SYM(conf_set, "rd_kafka_conf_set");
    SYM(conf_set_dr_msg_cb, "rd_kafka_conf_set_dr_msg_cb");
    SYM(conf_set_opaque, "rd_kafka_conf_set_opaque");
    SYM(conf_destroy, "rd_kafka_conf_destroy");
    SYM(kafka_new, "rd_kafka_new");
    SYM(kafka_destroy, "rd_kafka_destroy");
    SYM(poll, "rd_kafka_poll");
    SYM(flush, "rd_kafka_flush");
    SYM(outq_len, "rd_kafka_outq_len");
    SYM(err2str, "rd_kafka_err2str");
    SYM(topic_new, "rd_kafka_topic_new");
    SYM(topic_destroy, "rd_kafka_topic_destroy");
    SYM(produceva, "rd_kafka_produceva");
    SYM(error_code, "rd_kafka_error_code");
    SYM(error_destroy, "rd_kafka_error_destroy");
#undef SYM
    rk.loaded = 1;
    Py_RETURN_NONE;
}

static PyObject *err2str(PyObject *self, PyObject *args) {
    int code;
    if (!PyArg_ParseTuple(args, "i", &code)) return NULL;
    if (!rk.loaded) return PyErr_Format(PyExc_RuntimeError, "librdkafka not loaded");
    return PyUnicode_FromString(rk.err2str(code));
}

/* --- the producer ---------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    rd_kafka_topic_t *rkt;
    char *topic;
    long failures;
    char first_failure[512];
} Producer;

static void on_delivery(rd_kafka_t *k, const rd_kafka_message_t *m, void *opaque) {
    Producer *p = (Producer *)opaque;
    if (!m->err) return;
    if (!p->failures++)
        snprintf(p->first_failure, sizeof p->first_failure, "%s (partition %d)",
                 rk.err2str(m->err), (int)m->partition);
}

static int Producer_init(Producer *self, PyObject *args, PyObject *kwds) {
    PyObject *config, *key, *value;
    Py_ssize_t pos = 0;
    char errstr[512];
    if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &config)) return -1;
    if (!rk.loaded) {
        PyErr_SetString(PyExc_RuntimeError, "librdkafka not loaded: call load(path) first");
        return -1;
    }
    if (self->rk) {
        PyErr_SetString(PyExc_RuntimeError, "producer already initialised");
        return -1;
    }
    rd_kafka_conf_t *conf = rk.conf_new();
    while (PyDict_Next(config, &pos, &key, &value)) {
        const char *k = PyUnicode_AsUTF8(key), *v = k ? PyUnicode_AsUTF8(value) : NULL;
        if (!v) {
            rk.conf_destroy(conf);
            return -1; /* not a str key and value: TypeError already set */
        }
        if (rk.conf_set(conf, k, v, errstr, sizeof errstr) != RD_CONF_OK) {
            rk.conf_destroy(conf);
            PyErr_Format(PyExc_ValueError, "producer setting %s=%s: %s", k, v, errstr);
            return -1;
        }
    }
    rk.conf_set_dr_msg_cb(conf, on_delivery);
    rk.conf_set_opaque(conf, self);
    self->rk = rk.kafka_new(RD_PRODUCER, conf, errstr, sizeof errstr); /* owns conf on success */
    if (!self->rk) {
        rk.conf_destroy(conf);
        PyErr_Format(PyExc_ValueError, "cannot create the producer: %s", errstr);
        return -1;
    }
    return 0;
}

static void Producer_close_handle(Producer *self) {
    if (self->rkt) rk.topic_destroy(self->rkt);
    self->rkt = NULL;
    free(self->topic);
    self->topic = NULL;
    if (self->rk) {
        rd_kafka_t *k = self->rk;
        self->rk = NULL;
        Py_BEGIN_ALLOW_THREADS
        rk.kafka_destroy(k);
        Py_END_ALLOW_THREADS
    }
}

static void Producer_dealloc(Producer *self) {
    Producer_close_handle(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int open_handle(Producer *self) {
    if (!self->rk) {
        PyErr_SetString(PyExc_RuntimeError, "the producer is closed");
        return -1;
    }
    return 0;
}

/* A binary column: (offsets int32[n + 1], data bytes, validity uint8[n] or None). */
typedef struct {
    Py_buffer offsets, data, valid;
    int has_valid;
} Column;

static void column_release(Column *c) {
    if (c->offsets.obj) PyBuffer_Release(&c->offsets);
    if (c->data.obj) PyBuffer_Release(&c->data);
    if (c->has_valid) PyBuffer_Release(&c->valid);
}

static int column_get(PyObject *tuple, Py_ssize_t n, const char *what, Column *c) {
    PyObject *offsets, *data, *valid;
    memset(c, 0, sizeof *c);
    if (!PyArg_ParseTuple(tuple, "OOO", &offsets, &data, &valid)) return -1;
    if (PyObject_GetBuffer(offsets, &c->offsets, PyBUF_SIMPLE) ||
        PyObject_GetBuffer(data, &c->data, PyBUF_SIMPLE))
        goto fail;
    if (valid != Py_None) {
        if (PyObject_GetBuffer(valid, &c->valid, PyBUF_SIMPLE)) goto fail;
        c->has_valid = 1;
        if (c->valid.len != n) {
            PyErr_Format(PyExc_ValueError, "%s: %zd validity bytes for %zd records", what,
                         c->valid.len, n);
            goto fail;
        }
    }
    if (c->offsets.len != (n + 1) * (Py_ssize_t)sizeof(int32_t)) {
        PyErr_Format(PyExc_ValueError, "%s: %zd offset bytes for %zd records", what,
                     c->offsets.len, n);
        goto fail;
    }
    /* every record's bytes must lie inside the data buffer: checked once, up front */
    const int32_t *o = c->offsets.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (o[i] < 0 || o[i + 1] < o[i] || o[i + 1] > c->data.len) {
            PyErr_Format(PyExc_ValueError, "%s: record %zd's offsets %d..%d are outside its "
                         "%zd data bytes", what, i, o[i], o[i + 1], c->data.len);
            goto fail;
        }
    return 0;
fail:
    column_release(c);
    return -1;
}

static inline int column_null(const Column *c, Py_ssize_t i) {
    return c->has_valid && !((const uint8_t *)c->valid.buf)[i];
}

#define MAX_HEADERS 8

/* produce(topic, partitions, keys, values, header_names, header_columns) -> None
 * Enqueues record i = (partitions[i], keys[i], values[i], headers[*][i]) for every i, in
 * order; blocks (without the GIL) while librdkafka's queue is full. */
static PyObject *Producer_produce(Producer *self, PyObject *args) {
    const char *topic;
    PyObject *keys_t, *values_t, *names, *header_cols;
    Py_buffer parts;
    Column keys, values, headers[MAX_HEADERS];
    const char *header_names[MAX_HEADERS];
    Py_ssize_t n, nh = 0, done = 0;
    int err = 0, filled = 0;
    PyObject *result = NULL;

    if (open_handle(self)) return NULL;
    if (!PyArg_ParseTuple(args, "sy*OOO!O!", &topic, &parts, &keys_t, &values_t,
                          &PyTuple_Type, &names, &PyTuple_Type, &header_cols))
        return NULL;
    n = parts.len / (Py_ssize_t)sizeof(int32_t);
    if (parts.len % (Py_ssize_t)sizeof(int32_t)) {
        PyErr_SetString(PyExc_ValueError, "partitions: not an int32 buffer");
        PyBuffer_Release(&parts);
        return NULL;
    }
    memset(&keys, 0, sizeof keys);
    memset(&values, 0, sizeof values);
    nh = PyTuple_GET_SIZE(names);
    if (nh > MAX_HEADERS || nh != PyTuple_GET_SIZE(header_cols)) {
        PyErr_Format(PyExc_ValueError, "%zd header names for %zd header columns (at most %d)",
                     nh, PyTuple_GET_SIZE(header_cols), MAX_HEADERS);
        goto out;
    }
    if (column_get(keys_t, n, "keys", &keys) || column_get(values_t, n, "values", &values))
        goto out;
    for (; filled < nh; filled++) {
        header_names[filled] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, filled));
        if (!header_names[filled] ||
            column_get(PyTuple_GET_ITEM(header_cols, filled), n, header_names[filled],
                       &headers[filled]))
            goto out;
    }
    if (!self->topic || strcmp(self->topic, topic)) {
        if (self->rkt) rk.topic_destroy(self->rkt);
        free(self->topic);
        self->topic = strdup(topic);
        self->rkt = rk.topic_new(self->rk, topic, NULL);
        if (!self->rkt || !self->topic) {
            PyErr_Format(PyExc_ValueError, "cannot use topic %s", topic);
            goto out;
        }
    }

    Py_BEGIN_ALLOW_THREADS
    const int32_t *part = parts.buf;
    rd_kafka_vu_t vu[5 + MAX_HEADERS];
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t c = 0;
        const int32_t *ko = keys.offsets.buf, *vo = values.offsets.buf;
        vu[c].vtype = VT_RKT; vu[c++].u.rkt = self->rkt;
        vu[c].vtype = VT_PARTITION; vu[c++].u.i32 = part[i];
        vu[c].vtype = VT_MSGFLAGS; vu[c++].u.i = MSG_F_COPY;
        vu[c].vtype = VT_KEY;
        vu[c].u.mem.ptr = column_null(&keys, i) ? NULL : (const char *)keys.data.buf + ko[i];
        vu[c].u.mem.size = vu[c].u.mem.ptr ? (size_t)(ko[i + 1] - ko[i]) : 0;
        c++;
        vu[c].vtype = VT_VALUE;
        vu[c].u.mem.ptr = column_null(&values, i) ? NULL : (const char *)values.data.buf + vo[i];
        vu[c].u.mem.size = vu[c].u.mem.ptr ? (size_t)(vo[i + 1] - vo[i]) : 0;
        c++;
        for (Py_ssize_t h = 0; h < nh; h++) {
            const int32_t *ho = headers[h].offsets.buf;
            if (column_null(&headers[h], i)) continue; /* absent header */
            vu[c].vtype = VT_HEADER;
            vu[c].u.header.name = header_names[h];
            vu[c].u.header.val = (const char *)headers[h].data.buf + ho[i];
            vu[c++].u.header.size = ho[i + 1] - ho[i];
        }
        for (;;) {
            rd_kafka_error_t *e = rk.produceva(self->rk, vu, c);
            if (!e) break;
            err = rk.error_code(e);
            rk.error_destroy(e);
            if (err != ERR_QUEUE_FULL) break;
            err = 0;
            rk.poll(self->rk, 100); /* queue full: let deliveries drain, then retry */
        }
        if (err) break;
        done++;
        if (!(done & 4095)) rk.poll(self->rk, 0); /* serve delivery reports as we go */
    }
    Py_END_ALLOW_THREADS

    if (err) {
        PyErr_Format(PyExc_RuntimeError, "record %zd of %zd could not be produced to %s: %s",
                     done, n, topic, rk.err2str(err));
        goto out;
    }
    result = Py_None;
    Py_INCREF(result);
out:
    PyBuffer_Release(&parts);
    column_release(&keys);
    column_release(&values);
    for (int h = 0; h < filled; h++) column_release(&headers[h]);
    return result;
}

static PyObject *Producer_flush(Producer *self, PyObject *args) {
    double timeout;
    int left;
    if (!PyArg_ParseTuple(args, "d", &timeout) || open_handle(self)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rk.flush(self->rk, (int)(timeout * 1000));
    left = rk.outq_len(self->rk);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(left);
}

static PyObject *Producer_poll(Producer *self, PyObject *args) {
    double timeout;
    int served;
    if (!PyArg_ParseTuple(args, "d", &timeout) || open_handle(self)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    served = rk.poll(self->rk, (int)(timeout * 1000));
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(served);
}

static PyObject *Producer_take_failures(Producer *self, PyObject *noargs) {
    PyObject *out = Py_BuildValue("(ls)", self->failures, self->first_failure);
    self->failures = 0;
    self->first_failure[0] = 0;
    return out;
}

static PyObject *Producer_close(Producer *self, PyObject *noargs) {
    Producer_close_handle(self);
    Py_RETURN_NONE;
}

static PyMethodDef Producer_methods[] = {
    {"produce", (PyCFunction)Producer_produce, METH_VARARGS,
     "produce(topic, partitions, keys, values, header_names, header_columns)"},
    {"flush", (PyCFunction)Producer_flush, METH_VARARGS,
     "flush(timeout_s) -> records still unacknowledged"},
    {"poll", (PyCFunction)Producer_poll, METH_VARARGS, "poll(timeout_s) -> events served"},
    {"take_failures", (PyCFunction)Producer_take_failures, METH_NOARGS,
     "take_failures() -> (delivery failures since the last call, the first one's text)"},
    {"close", (PyCFunction)Producer_close, METH_NOARGS, "close() -> None"},
    {NULL}};

static PyTypeObject ProducerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lance_cdf.kafka._produce.Producer",
    .tp_basicsize = sizeof(Producer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Producer(config: dict[str, str]): a librdkafka producer fed by columns",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Producer_init,
    .tp_dealloc = (destructor)Producer_dealloc,
    .tp_methods = Producer_methods,
};

static PyMethodDef module_methods[] = {
    {"load", load, METH_VARARGS, "load(path): dlopen librdkafka (once per process)"},
    {"err2str", err2str, METH_VARARGS, "err2str(code) -> librdkafka's text for an error code"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_produce", NULL, -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__produce(void) {
    if (PyType_Ready(&ProducerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ProducerType);
    if (PyModule_AddObject(m, "Producer", (PyObject *)&ProducerType) < 0) {
        Py_DECREF(&ProducerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
