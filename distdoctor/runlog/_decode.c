/* The event log's slots decoded in C: what a reader (the live diagnosis, `diagnose`, the
 * collector) runs for every event of every rank, with runlog/reader.py's
 * RankLog._decode as the reference and the fallback.
 *
 * Why C: a slot cost ~1.9 us to decode in Python (struct.iter_unpack's tuple, a dozen
 * cache look-ups, the Event's generated __init__), a fifth of what the live diagnosis
 * spent per event at 2 ranks x 1,000 collectives/s (issue 49).
 *
 * decode(data, first, rank, groups, tensors, codes, strings, texts, event_type)
 *     -> (list, misses)
 *   `data`: whole slots of one stretch of the ring, the first holding event `first`.
 *   Each slot gives, in the list, in order: an Event; None where the slot does not hold its event (its
 *   number word is not first + i + 1: not written yet, being rewritten, overwritten); or
 *   the event's number (an int) where something it names is not in the reader's caches
 *   yet (a group, a tensor description, a code combination, a string the table has not
 *   been read up to): the reader decodes that one in Python, which fills the caches.
 *   The caches hold only decoded, validated values (reader.py checks what a log says),
 *   so a crafted slot can make C look up an id, never read past the slot.
 *
 * The Event is made as Event(*fields) would make it; where Event is a slots dataclass
 * whose fields are plain member slots (checked once per type), its fields are stored
 * straight into them, the generated __init__ being a third of a slot's cost.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include "slot_fields.h"
#include "slot_layout.h"
#define STATUS_IN_FLIGHT 0

/* Event's fields, in order (runlog/event.py); the decoder fills all of them. */
#define N_FIELDS 25
static const char *FIELDS[N_FIELDS] = {
    "rank", "index", "kind", "op", "status", "group", "group_desc", "group_ranks", "seq",
    "peer", "shapes", "dtypes", "device", "numel_in", "numel_out", "reduce_op", "callsite",
    "t_enter_ns", "t_end_ns", "span_index", "name", "error", "is_async", "other_thread",
    "implicit"};

/* Event's class, learnt on first use (its fields stored by offset: slot_fields.h). */
static Layout EVENT = {FIELDS, N_FIELDS};

static inline uint64_t u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline int64_t i64(const unsigned char *p) { int64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline int32_t i32(const unsigned char *p) { int32_t v; memcpy(&v, p, 4); return v; }

/* dict[int_key] as a borrowed reference, or NULL (not there; no error set). */
static PyObject *lookup(PyObject *dict, unsigned long long key)
{
    PyObject *k = PyLong_FromUnsignedLongLong(key);
    if (k == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *v = PyDict_GetItemWithError(dict, k);
    Py_DECREF(k);
    if (v == NULL)
        PyErr_Clear();
    return v;
}

/* One slot decoded; 1: `*out` is a new Event; 0: a cache miss (decode it in Python);
 * -1: an error is set. */
static int decode_slot(const unsigned char *s, long long e, PyObject *rank,
                       PyObject *groups, PyObject *tensors, PyObject *codes,
                       PyObject *strings, PyObject *texts, PyTypeObject *type,
                       PyObject **out)
{
    /* runlog/values.py code_word: decoded_codes's key */
    uint64_t code_key = (uint64_t)s[S_KIND] | (uint64_t)s[S_OP] << 8 |
                        (uint64_t)s[S_STATUS] << 16 | (uint64_t)s[S_REDOP] << 24 |
                        (uint64_t)s[S_FLAGS] << 32;
    PyObject *c = lookup(codes, code_key);
    PyObject *g = lookup(groups, u32(s + S_GROUP));
    PyObject *t = lookup(tensors, u32(s + S_TENSORS));
    if (c == NULL || g == NULL || t == NULL || !PyTuple_CheckExact(c) ||
        PyTuple_GET_SIZE(c) != 7 || !PyTuple_CheckExact(g) || PyTuple_GET_SIZE(g) != 3 ||
        !PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 3)
        return 0;
    PyObject *callsite = Py_None, *name = Py_None, *error = Py_None;
    uint32_t cs = u32(s + S_CALLSITE), nm = u32(s + S_NAME), er = u32(s + S_ERROR);
    if (cs) {
        if ((Py_ssize_t)cs >= PyList_GET_SIZE(strings))
            return 0;  /* the table not read that far yet */
        callsite = PyList_GET_ITEM(strings, cs);
        if (!PyDict_Check(callsite))
            callsite = Py_None;  /* a corrupt log's id naming another kind of value */
    }
    if (nm && (name = lookup(texts, nm)) == NULL)
        return 0;
    if (er && (error = lookup(texts, er)) == NULL)
        return 0;

    int in_flight = s[S_STATUS] == STATUS_IN_FLIGHT;
    int64_t t_end = in_flight ? 0 : i64(s + S_END);
    int32_t peer = i32(s + S_PEER);
    PyObject *fresh[8] = {
        PyLong_FromLongLong(e),
        PyLong_FromUnsignedLongLong(u64(s + S_SEQ)),
        peer < 0 ? Py_NewRef(Py_None) : PyLong_FromLong(peer),
        PyLong_FromLongLong(i64(s + S_NUMEL_IN)),
        PyLong_FromLongLong(i64(s + S_NUMEL_OUT)),
        PyLong_FromLongLong(i64(s + S_ENTER)),
        t_end ? PyLong_FromLongLong(t_end) : Py_NewRef(Py_None),
        PyLong_FromUnsignedLongLong(u64(s + S_SPAN)),
    };
    int rc = 1;
    for (int i = 0; i < 8; i++)
        if (fresh[i] == NULL)
            rc = -1;
    if (rc == 1) {
        /* Event's field order (runlog/event.py) */
        PyObject *args[N_FIELDS] = {
            rank, fresh[0], PyTuple_GET_ITEM(c, 0), PyTuple_GET_ITEM(c, 1),
            PyTuple_GET_ITEM(c, 2), PyTuple_GET_ITEM(g, 0), PyTuple_GET_ITEM(g, 1),
            PyTuple_GET_ITEM(g, 2), fresh[1], fresh[2], PyTuple_GET_ITEM(t, 0),
            PyTuple_GET_ITEM(t, 1), PyTuple_GET_ITEM(t, 2), fresh[3], fresh[4],
            PyTuple_GET_ITEM(c, 3), callsite, fresh[5], fresh[6], fresh[7], name, error,
            PyTuple_GET_ITEM(c, 4), PyTuple_GET_ITEM(c, 5), PyTuple_GET_ITEM(c, 6)};
        *out = layout_make(&EVENT, args);
        if (*out == NULL)
            rc = -1;
    }
    for (int i = 0; i < 8; i++)
        Py_XDECREF(fresh[i]);
    return rc;
}

static PyObject *decode(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    if (n != 9) {
        PyErr_SetString(PyExc_TypeError, "decode takes 9 arguments");
        return NULL;
    }
    PyObject *rank = args[2], *groups = args[3], *tensors = args[4], *codes = args[5],
             *strings = args[6], *texts = args[7], *type = args[8];
    if (!PyDict_Check(groups) || !PyDict_Check(tensors) || !PyDict_Check(codes) ||
        !PyList_Check(strings) || !PyDict_Check(texts) || !PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "decode: caches are dicts, strings a list");
        return NULL;
    }
    long long first = PyLong_AsLongLong(args[1]);
    if (first == -1 && PyErr_Occurred())
        return NULL;
    layout_learn(&EVENT, (PyTypeObject *)type);
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t count = view.len / SLOT_SIZE;
    Py_ssize_t misses = 0;
    PyObject *out = PyList_New(count);
    if (out == NULL)
        goto done;
    const unsigned char *base = view.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        const unsigned char *s = base + i * SLOT_SIZE;
        long long e = first + i;
        PyObject *item = NULL;
        if (u64(s) != (uint64_t)e + 1) {
            item = Py_NewRef(Py_None);
        } else {
            int rc = decode_slot(s, e, rank, groups, tensors, codes, strings, texts,
                                 (PyTypeObject *)type, &item);
            if (rc < 0) {
                Py_CLEAR(out);
                goto done;
            }
            if (rc == 0 && (misses++, item = PyLong_FromLongLong(e)) == NULL) {
                Py_CLEAR(out);
                goto done;
            }
        }
        PyList_SET_ITEM(out, i, item);
    }
done:
    PyBuffer_Release(&view);
    if (out == NULL)
        return NULL;
    PyObject *pair = Py_BuildValue("(Nn)", out, misses);
    return pair;
}

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))decode, METH_FASTCALL,
     "decode(data, first, rank, groups, tensors, codes, strings, texts, event_type)"
     " -> (events, misses)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decode",
                                    "The event log's slots decoded in C.", -1, methods};

PyMODINIT_FUNC PyInit__decode(void) { return PyModule_Create(&module); }
