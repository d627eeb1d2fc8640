/* The tracer's hot path in C: what every traced op runs, with the pure-Python path in
 * tracer/recorder.py and runlog/slots.py as the reference and the fallback.
 *
 * It lives in the run log (built as distdoctor.runlog._fast) because its SlotWriter is the
 * run log's slot writer (runlog/slots.py); the Core writes through that SlotWriter's C
 * functions, so the two stay one extension, which imports nothing of distdoctor. The
 * tracer reaches it downward, through runlog/slots.py's native_module().
 *
 * Three types:
 *   SlotWriter: appends and completes the fixed-size records of a rank's event log
 *     (runlog/ring.py's RingWriter owns one). Stores, in the order readers rely on: a
 *     slot's number word is cleared, the body written, then the number (release), then
 *     the header's head; a completion writes the end time last (release).
 *   Core: Recorder.begin and Recorder.end for the common case, byte for byte what the
 *     Python methods record. Anything unusual (a new call site, new tensor shapes, an
 *     async or CUDA op's completion) is handed to the Python methods named at
 *     construction.
 *   TracedMethod: a TracingProcessGroup method (tracer/process_group.py) whose common
 *     case (positional arguments, a device and backend method met before) runs in one
 *     C call through its recorder's Core; everything else is its Python method's.
 *
 * Why C: a traced op cost ~6 us of Python on top of torch's own call (fake backend),
 * most of it bytecode around a few dict look-ups and attribute reads. The pybind reads
 * (reduceOp, shape, dtype, device, numel) cost the same here; the rest mostly goes.
 *
 * Never raises into the job: begin reports an Exception through `on_error` and returns
 * None (the op is then not recorded); end raises only what the op's own wait raised.
 * Everything runs with the GIL held, so the event counter needs no lock.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030B0000
#error "the native tracer needs CPython 3.11 or newer (PyFrame_GetLasti)"
#endif
#include "slot_layout.h"

static inline void put_u64_release(char *p, uint64_t v)
{
    __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE);
}

static inline int64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* what time.monotonic_ns() reads on Linux */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ------------------------------------------------------------------ SlotWriter */

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    char *base; /* NULL once released */
    long long ring_offset, capacity, margin;
    long long ready; /* file bytes backed by disk (set by the owner as it reserves) */
    char starved;
    unsigned long long next; /* the next event number */
    PyObject *near_end;      /* (at) -> bool: wake the reserver; False: disk full */
    PyObject *unrecorded;    /* () -> -1, counting an event not written */
} SlotWriter;

typedef struct {
    int kind, op, redop, flags;
    uint32_t group_id, callsite_id, tensors_id, name_id;
    uint64_t seq, span_index;
    int32_t peer;
    int64_t numel_in, numel_out, t_enter;
} Record;

static long long slots_unrecorded(SlotWriter *s)
{
    PyObject *r = PyObject_CallNoArgs(s->unrecorded);
    if (r == NULL)
        return LLONG_MIN;
    Py_DECREF(r);
    return -1;
}

/* The event number, -1 when not written (disk full), LLONG_MIN with an exception set. */
static long long slots_append(SlotWriter *s, const Record *r)
{
    if (s->base == NULL) {
        PyErr_SetString(PyExc_ValueError, "the event log is closed");
        return LLONG_MIN;
    }
    if (s->starved)
        return slots_unrecorded(s);
    unsigned long long e = s->next++;
    long long at = s->ring_offset + (long long)(e % (unsigned long long)s->capacity) * SLOT_SIZE;
    if (at + s->margin >= s->ready) { /* false once the whole ring is reserved */
        PyObject *ok = PyObject_CallFunction(s->near_end, "L", at);
        if (ok == NULL)
            return LLONG_MIN;
        int fits = PyObject_IsTrue(ok);
        Py_DECREF(ok);
        if (fits < 0)
            return LLONG_MIN;
        if (!fits)
            return slots_unrecorded(s); /* `e` stays a hole: readers skip it */
    }
    char *p = s->base + at;
    put_u64_release(p, 0); /* invalidate the slot while it is rewritten */
    char body[SLOT_SIZE - 8];
    memset(body, 0, sizeof body);
    char *b = body - 8; /* offsets below are from the slot's start */
    b[S_KIND] = (char)r->kind;
    b[S_STATUS] = 0; /* in flight */
    b[S_OP] = (char)r->op;
    b[S_REDOP] = (char)r->redop;
    b[S_FLAGS] = (char)r->flags;
    memcpy(b + S_GROUP, &r->group_id, 4);
    memcpy(b + S_CALLSITE, &r->callsite_id, 4);
    memcpy(b + S_SEQ, &r->seq, 8);
    memcpy(b + S_PEER, &r->peer, 4);
    memcpy(b + S_TENSORS, &r->tensors_id, 4);
    memcpy(b + S_NUMEL_IN, &r->numel_in, 8);
    memcpy(b + S_NUMEL_OUT, &r->numel_out, 8);
    memcpy(b + S_ENTER, &r->t_enter, 8);
    memcpy(b + S_SPAN, &r->span_index, 8);
    memcpy(b + S_NAME, &r->name_id, 4);
    memcpy(p + 8, body, S_ERROR + 4 - 8);
    put_u64_release(p, e + 1);
    put_u64_release(s->base + OFF_HEAD, e + 1);
    return (long long)e;
}

static int slots_complete(SlotWriter *s, long long e, int status, int64_t t_end,
                          uint32_t error_id)
{
    if (e < 0)
        return 0;
    if (s->base == NULL) {
        PyErr_SetString(PyExc_ValueError, "the event log is closed");
        return -1;
    }
    char *p = s->base + s->ring_offset + (long long)((unsigned long long)e % s->capacity) * SLOT_SIZE;
    if (__atomic_load_n((uint64_t *)p, __ATOMIC_ACQUIRE) != (uint64_t)e + 1)
        return 0; /* the slot was reused since */
    if (error_id)
        memcpy(p + S_ERROR, &error_id, 4);
    p[S_STATUS] = (char)status;
    __atomic_store_n((int64_t *)(p + S_END), t_end, __ATOMIC_RELEASE); /* marks completion */
    return 0;
}

static int SlotWriter_init(SlotWriter *s, PyObject *args, PyObject *kw)
{
    static char *names[] = {"buffer", "ring_offset", "capacity", "margin", "near_end",
                            "unrecorded", NULL};
    PyObject *buffer, *near_end, *unrecorded;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OLLLOO", names, &buffer, &s->ring_offset,
                                     &s->capacity, &s->margin, &near_end, &unrecorded))
        return -1;
    if (s->base != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SlotWriter initialised twice");
        return -1;
    }
    if (PyObject_GetBuffer(buffer, &s->view, PyBUF_WRITABLE) < 0)
        return -1;
    if (s->capacity < 1 || s->ring_offset < OFF_HEAD + 8 ||
        s->ring_offset + s->capacity * SLOT_SIZE > s->view.len) {
        PyBuffer_Release(&s->view);
        PyErr_SetString(PyExc_ValueError, "the ring does not fit the buffer");
        return -1;
    }
    s->base = s->view.buf;
    Py_INCREF(near_end);
    Py_INCREF(unrecorded);
    s->near_end = near_end;
    s->unrecorded = unrecorded;
    return 0;
}

static PyObject *SlotWriter_release(SlotWriter *s, PyObject *unused)
{
    if (s->base != NULL) {
        s->base = NULL;
        PyBuffer_Release(&s->view);
    }
    Py_RETURN_NONE;
}

static int SlotWriter_traverse(SlotWriter *s, visitproc visit, void *arg)
{
    Py_VISIT(s->near_end);
    Py_VISIT(s->unrecorded);
    return 0;
}

static int SlotWriter_clear(SlotWriter *s)
{
    Py_CLEAR(s->near_end);
    Py_CLEAR(s->unrecorded);
    return 0;
}

static void SlotWriter_dealloc(SlotWriter *s)
{
    PyObject_GC_UnTrack(s);
    SlotWriter_release(s, NULL);
    SlotWriter_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *SlotWriter_append(SlotWriter *s, PyObject *const *args, Py_ssize_t n)
{
    if (n != 14) {
        PyErr_SetString(PyExc_TypeError, "append takes 14 arguments");
        return NULL;
    }
    long long v[14];
    for (int i = 0; i < 14; i++) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    Record r = {(int)v[0], (int)v[1], (int)v[2], (int)v[3], (uint32_t)v[4], (uint32_t)v[5],
                (uint32_t)v[8], (uint32_t)v[13], (uint64_t)v[6], (uint64_t)v[12],
                (int32_t)v[7], v[9], v[10], v[11]};
    long long e = slots_append(s, &r);
    return e == LLONG_MIN ? NULL : PyLong_FromLongLong(e);
}

static PyObject *SlotWriter_complete(SlotWriter *s, PyObject *const *args, Py_ssize_t n)
{
    if (n < 3 || n > 4) {
        PyErr_SetString(PyExc_TypeError, "complete takes 3 or 4 arguments");
        return NULL;
    }
    long long e = PyLong_AsLongLong(args[0]);
    long status = PyLong_AsLong(args[1]);
    long long t_end = PyLong_AsLongLong(args[2]);
    unsigned long error_id = n == 4 ? PyLong_AsUnsignedLong(args[3]) : 0;
    if (PyErr_Occurred())
        return NULL;
    if (slots_complete(s, e, (int)status, t_end, (uint32_t)error_id) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef SlotWriter_methods[] = {
    {"append", (PyCFunction)(void (*)(void))SlotWriter_append, METH_FASTCALL,
     "append(kind, op, redop, flags, group_id, callsite_id, seq, peer, tensors_id, "
     "numel_in, numel_out, t_enter_ns, span_index, name_id) -> event number (-1: not written)"},
    {"complete", (PyCFunction)(void (*)(void))SlotWriter_complete, METH_FASTCALL,
     "complete(e, status, t_end_ns, error_id=0): mark event e finished"},
    {"release", (PyCFunction)SlotWriter_release, METH_NOARGS,
     "let go of the buffer (before the map is closed)"},
    {NULL},
};

static PyMemberDef SlotWriter_members[] = {
    {"ready", T_LONGLONG, offsetof(SlotWriter, ready), 0, "file bytes backed by disk"},
    {"starved", T_BOOL, offsetof(SlotWriter, starved), 0, "the disk is full: nothing written"},
    {NULL},
};

static PyTypeObject SlotWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "distdoctor.runlog._fast.SlotWriter",
    .tp_basicsize = sizeof(SlotWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The event log's slot writer (see runlog/ring.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)SlotWriter_init,
    .tp_dealloc = (destructor)SlotWriter_dealloc,
    .tp_traverse = (traverseproc)SlotWriter_traverse,
    .tp_clear = (inquiry)SlotWriter_clear,
    .tp_methods = SlotWriter_methods,
    .tp_members = SlotWriter_members,
};

/* ------------------------------------------------------------------------ Core */

/* Python objects the core uses; each is a reference it holds (see Core_init). */
#define CORE_OBJECTS(X)                                                                 \
    X(slots)          /* the log's SlotWriter */                                        \
    X(recorder)       /* passed to pg._dd_describe */                                   \
    X(pending)        /* PendingCompletions: ._pending looked at, .check() called */    \
    X(spans)          /* the open spans (list of event numbers) */                      \
    X(callsites)      /* site_key() -> (string id, code), this core's */               \
    X(tensor_ids)     /* (shape, dtype, device) -> string id, shared with Python */     \
    X(internal)       /* callsite._internal: id(code) -> (code, is_internal) */         \
    X(fields)         /* recorder._FIELDS: options type -> (reduceOp, rootRank, asyncOp) */ \
    X(is_internal)    /* callsite._is_internal(code) */                                 \
    X(fields_of)      /* recorder._fields_of(type) */                                   \
    X(redop_reader)   /* None: hash(reduceOp) is its number; else reader(reduceOp) */   \
    X(tensors_miss)   /* (tensors) -> string id */                                      \
    X(callsite_miss)  /* (frame, key, table, framework frame) -> string id */           \
    X(off_main)       /* unused: the main thread's line is found in C (callsite_id) */  \
    X(on_error)       /* (spec, exc): begin failed */                                   \
    X(end_other)      /* (token, work) -> work: every completion but a sync CPU op's */ \
    X(finish)         /* (e, exc): an op failed */                                      \
    X(work_class)     /* unused: the last waited work is this core's (last_waited) */

typedef struct {
    PyObject_HEAD
#define FIELD(name) PyObject *name;
    CORE_OBJECTS(FIELD)
#undef FIELD
    unsigned long main_ident;
    int kind_p2p, redop_none, flag_async, flag_async_unknown, flag_other_thread, status_ok;
    struct SiteSlot *sites; /* call sites already interned, by their key's words */
    size_t sites_mask, sites_used;
    struct CodeSlot *codes; /* code objects already judged internal or not */
    size_t codes_mask, codes_used;
    /* the last work a synchronous op waited on, freed when the next one is waited on,
     * with the GIL (see work.RecordingWork): held here, not as a class attribute, whose
     * every assignment invalidated the type's attribute caches (~0.3 us an op) */
    PyObject *last_waited;
    PyObject *cpu_tensor_ids; /* (shape, dtype) of one CPU tensor -> string id */
} Core;

static PyObject *s_pending, *s_check, *s_group_id, *s_describe, *s_seq, *s_p2p_seq, *s_kind,
    *s_op, *s_code, *s_method, *s_reduceOp, *s_rootRank, *s_asyncOp, *s_shape, *s_dtype,
    *s_device, *s_is_cuda, *s_is_cpu, *s_numel, *s_wait, *s_last_waited;

static int Core_init(Core *c, PyObject *args, PyObject *kw)
{
    static char *names[] = {
#define NAME(name) #name,
        CORE_OBJECTS(NAME)
#undef NAME
        "main_ident", "constants", NULL};
    PyObject *o[18], *constants;
    unsigned long main_ident;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "O!OOO!O!O!O!O!OOOOOOOOOOkO!", names, &SlotWriterType, &o[0], &o[1],
            &o[2], &PyList_Type, &o[3], &PyDict_Type, &o[4], &PyDict_Type, &o[5],
            &PyDict_Type, &o[6], &PyDict_Type, &o[7], &o[8], &o[9], &o[10], &o[11], &o[12],
            &o[13], &o[14], &o[15], &o[16], &o[17], &main_ident, &PyDict_Type, &constants))
        return -1;
    struct { const char *name; int *at; } wanted[] = {
        {"KIND_P2P", &c->kind_p2p}, {"REDOP_NONE", &c->redop_none},
        {"FLAG_ASYNC", &c->flag_async}, {"FLAG_ASYNC_UNKNOWN", &c->flag_async_unknown},
        {"FLAG_OTHER_THREAD", &c->flag_other_thread}, {"STATUS_OK", &c->status_ok}};
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
        PyObject *v = PyDict_GetItemString(constants, wanted[i].name);
        if (v == NULL) {
            PyErr_Format(PyExc_KeyError, "constant %s missing", wanted[i].name);
            return -1;
        }
        *wanted[i].at = (int)PyLong_AsLong(v);
        if (PyErr_Occurred())
            return -1;
    }
    int i = 0;
#define SET(name) Py_INCREF(o[i]); Py_XSETREF(c->name, o[i]); i++;
    CORE_OBJECTS(SET)
#undef SET
    c->main_ident = main_ident;
    if (c->cpu_tensor_ids == NULL && (c->cpu_tensor_ids = PyDict_New()) == NULL)
        return -1;
    return 0;
}

static int Core_traverse(Core *c, visitproc visit, void *arg)
{
#define VISIT(name) Py_VISIT(c->name);
    CORE_OBJECTS(VISIT)
#undef VISIT
    Py_VISIT(c->last_waited);
    Py_VISIT(c->cpu_tensor_ids);
    return 0;
}

static int Core_clear(Core *c)
{
#define CLEAR(name) Py_CLEAR(c->name);
    CORE_OBJECTS(CLEAR)
#undef CLEAR
    Py_CLEAR(c->last_waited);
    Py_CLEAR(c->cpu_tensor_ids);
    return 0;
}

static void Core_dealloc(Core *c)
{
    PyObject_GC_UnTrack(c);
    PyMem_Free(c->sites);
    c->sites = NULL;
    PyMem_Free(c->codes);
    c->codes = NULL;
    Core_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* An int attribute; -1 with an exception set on failure. */
static long long get_int_attr(PyObject *o, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    long long r = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return r;
}

static int64_t numel_of(PyObject *tensors)
{
    Py_ssize_t n = PyList_GET_SIZE(tensors);
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyObject_CallMethodNoArgs(PyList_GET_ITEM(tensors, i), s_numel);
        if (v == NULL)
            return -1;
        total += PyLong_AsLongLong(v);
        Py_DECREF(v);
        if (PyErr_Occurred())
            return -1;
    }
    return total;
}

/* The product of a shape's sizes (a tensor's numel), or -1 where it is not all ints. */
static int64_t shape_numel(PyObject *shape)
{
    if (!PyTuple_Check(shape))
        return -1;
    int64_t n = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++) {
        PyObject *d = PyTuple_GET_ITEM(shape, i);
        if (!PyLong_CheckExact(d))
            return -1;
        long long v = PyLong_AsLongLong(d);
        if (v < 0) {
            PyErr_Clear();
            return -1;
        }
        n *= v;
    }
    return n;
}

/* The string id of the tensors' description (recorder._tensors_id). `cpu`: the one
 * tensor is known to be on the CPU; its key is then (shape, dtype) in this core's own
 * table, and no device object is made. *numel: that tensor's element count, read off
 * the shape (a numel() call less), where it was. */
static long long tensors_id(Core *c, PyObject *tensors, int cpu, int64_t *numel)
{
    Py_ssize_t n = PyList_GET_SIZE(tensors);
    if (n == 0)
        return 0;
    PyObject *cpu_key = NULL;
    if (n == 1) {
        PyObject *t = PyList_GET_ITEM(tensors, 0);
        PyObject *key = PyTuple_New(cpu ? 2 : 3);
        if (key == NULL)
            return -1;
        PyObject *shape = PyObject_GetAttr(t, s_shape), *dtype = NULL, *device = NULL;
        if (shape)
            dtype = PyObject_GetAttr(t, s_dtype);
        if (dtype && !cpu)
            device = PyObject_GetAttr(t, s_device);
        if (shape)
            *numel = shape_numel(shape);
        PyTuple_SET_ITEM(key, 0, shape ? shape : Py_NewRef(Py_None));
        PyTuple_SET_ITEM(key, 1, dtype ? dtype : Py_NewRef(Py_None));
        if (!cpu)
            PyTuple_SET_ITEM(key, 2, device ? device : Py_NewRef(Py_None));
        if (cpu ? dtype == NULL : device == NULL) {
            Py_DECREF(key);
            return -1;
        }
        PyObject *hit = PyDict_GetItemWithError(cpu ? c->cpu_tensor_ids : c->tensor_ids, key);
        if (hit != NULL) {
            Py_DECREF(key);
            return PyLong_AsLongLong(hit);
        }
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
        if (cpu)
            cpu_key = key;
        else
            Py_DECREF(key);
    }
    PyObject *sid = PyObject_CallOneArg(c->tensors_miss, tensors);
    long long r = sid == NULL ? -1 : PyLong_AsLongLong(sid);
    if (cpu_key != NULL && r > 0 && PyDict_SetItem(c->cpu_tensor_ids, cpu_key, sid) < 0)
        r = -1;
    Py_XDECREF(sid);
    Py_XDECREF(cpu_key);
    return r;
}

/* What callsite._internal says of each code object met, by its address: a frame's
 * judgement costs a probe of this table, not a Python int and a dict look-up. An entry
 * is added once callsite._internal holds the code object (it never lets one go), so the
 * address cannot be reused by other code while the entry lives. */
typedef struct CodeSlot {
    uintptr_t code; /* 0: empty */
    int internal, framework;
} CodeSlot;

static CodeSlot *code_find(Core *c, uintptr_t code)
{
    if (c->codes == NULL)
        return NULL;
    for (size_t i = (code >> 4) * 0x9E3779B97F4A7C15ull & c->codes_mask;;
         i = (i + 1) & c->codes_mask) {
        CodeSlot *s = &c->codes[i];
        if (s->code == code || s->code == 0)
            return s;
    }
}

static void code_add(Core *c, uintptr_t code, int internal, int framework)
{
    if (c->codes == NULL || 2 * (c->codes_used + 1) > c->codes_mask + 1) {
        size_t cap = c->codes == NULL ? 256 : 2 * (c->codes_mask + 1);
        size_t old_cap = c->codes == NULL ? 0 : c->codes_mask + 1;
        CodeSlot *grown = PyMem_Calloc(cap, sizeof *grown), *old = c->codes;
        if (grown == NULL)
            return;
        c->codes = grown;
        c->codes_mask = cap - 1;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].code)
                *code_find(c, old[i].code) = old[i];
        PyMem_Free(old);
    }
    CodeSlot *s = code_find(c, code);
    if (s->code == 0) {
        s->code = code;
        s->internal = internal;
        s->framework = framework;
        c->codes_used++;
    }
}

/* Whether a code object is distdoctor's, torch's or the standard library's (cached in
 * callsite._internal): 1, 0, or -1 with an exception set. *framework is set to 1 where
 * it is a framework's code that issues collectives for the user (the entry's third
 * item, callsite.framework_of), when framework is not NULL. */
static int code_internal(Core *c, PyCodeObject *code, int *framework)
{
    CodeSlot *known = code_find(c, (uintptr_t)code);
    if (known != NULL && known->code != 0) {
        if (framework != NULL)
            *framework = known->framework;
        return known->internal;
    }
    PyObject *key = PyLong_FromVoidPtr(code);
    if (key == NULL)
        return -1;
    PyObject *hit = PyDict_GetItemWithError(c->internal, key);
    if (hit == NULL && !PyErr_Occurred()) { /* a code object seen for the first time */
        PyObject *r = PyObject_CallOneArg(c->is_internal, (PyObject *)code);
        Py_XDECREF(r);
        hit = r == NULL ? NULL : PyDict_GetItemWithError(c->internal, key);
    }
    Py_DECREF(key);
    if (hit != NULL && PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) >= 2) {
        int fw = PyTuple_GET_SIZE(hit) >= 3 && PyTuple_GET_ITEM(hit, 2) != Py_None;
        int internal = PyTuple_GET_ITEM(hit, 1) == Py_True;
        if (framework != NULL)
            *framework = fw;
        if (PyTuple_GET_ITEM(hit, 0) == (PyObject *)code) /* held there: see CodeSlot */
            code_add(c, (uintptr_t)code, internal, fw);
        return internal;
    }
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "is_internal did not fill callsite._internal");
    return -1;
}

/* Up to MAX_CALLERS user frames that called the user's frame `f`, looked for within
 * MAX_HOPS frames (callsite.CALLERS and callsite.CALLER_HOPS: the miss path walks the
 * same way). They make the call site's key: a helper's barrier called from two places is
 * two sites, which is what tells where two ranks' paths parted. */
#ifndef MAX_CALLERS
#define MAX_CALLERS 3
#endif
#define MAX_HOPS 32

/* The key of the call site at user frame `f` (tracer/sites.py: site_key), as raw words:
 * id(code), lasti, False (0), thread ident or 0 on the main thread, id(code) and lasti
 * of the framework frame `fw` or 0, 0, then id(code), lasti of each caller. Their count,
 * or -1 with an exception set. Words, not Python objects: a call site seen before is
 * found without allocating anything (the key tuple is built only on a miss). */
#define SITE_WORDS (6 + 2 * MAX_CALLERS)
static int site_words(Core *c, PyFrameObject *f, PyCodeObject *code, PyFrameObject *fw,
                      int from_main, uint64_t *w)
{
    unsigned long me = PyThread_get_thread_ident();
    w[0] = (uint64_t)(uintptr_t)code;
    w[1] = (uint64_t)(int64_t)PyFrame_GetLasti(f);
    w[2] = from_main != 0;
    w[3] = from_main || me == c->main_ident ? 0 : (uint64_t)me;
    w[4] = w[5] = 0;
    if (fw != NULL) {
        PyCodeObject *fwc = PyFrame_GetCode(fw);
        w[4] = (uint64_t)(uintptr_t)fwc;
        w[5] = (uint64_t)(int64_t)PyFrame_GetLasti(fw);
        Py_DECREF(fwc);
    }
    int n = 6;
    PyFrameObject *b = PyFrame_GetBack(f);
    for (int found = 0, hops = 0; b != NULL && found < MAX_CALLERS && hops < MAX_HOPS; hops++) {
        PyCodeObject *bc = PyFrame_GetCode(b);
        int internal = code_internal(c, bc, NULL);
        if (internal < 0) {
            Py_DECREF(bc);
            Py_DECREF(b);
            return -1;
        }
        if (!internal) {
            w[n++] = (uint64_t)(uintptr_t)bc;
            w[n++] = (uint64_t)(int64_t)PyFrame_GetLasti(b);
            found++;
        }
        Py_DECREF(bc);
        PyFrameObject *next = PyFrame_GetBack(b);
        Py_DECREF(b);
        b = next;
    }
    Py_XDECREF(b);
    return n;
}

/* The key tuple of site_key() from its words (a miss: CallSites.at takes it). */
static PyObject *site_key(const uint64_t *w, int n)
{
    PyObject *k = PyTuple_New(n);
    if (k == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *v;
        if (i == 2)
            v = PyBool_FromLong((long)w[i]);
        else if (i == 3)
            v = PyLong_FromUnsignedLongLong(w[i]);
        else if (i == 0 || i == 4 || (i >= 6 && i % 2 == 0))
            v = PyLong_FromVoidPtr((void *)(uintptr_t)w[i]);
        else
            v = PyLong_FromLongLong((long long)(int64_t)w[i]);
        if (v == NULL) {
            Py_DECREF(k);
            return NULL;
        }
        PyTuple_SET_ITEM(k, i, v);
    }
    return k;
}

/* The table of call sites by words: open addressing, a power of two, at most half full.
 * An entry is added only once CallSites.at's table holds the key, and with it the key's
 * code objects: their addresses cannot be reused by other code while the entry lives. */
typedef struct SiteSlot {
    uint64_t hash;
    int n; /* 0: empty */
    long long sid;
    uint64_t w[SITE_WORDS];
} SiteSlot;

static uint64_t hash_words(const uint64_t *w, int n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) {
        h = (h ^ w[i]) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    return h;
}

static SiteSlot *site_find(Core *c, const uint64_t *w, int n, uint64_t h)
{
    if (c->sites == NULL)
        return NULL;
    for (size_t i = h & c->sites_mask;; i = (i + 1) & c->sites_mask) {
        SiteSlot *s = &c->sites[i];
        if (s->n == 0)
            return s;
        if (s->hash == h && s->n == n && memcmp(s->w, w, n * sizeof *w) == 0)
            return s;
    }
}

/* Remember a site; on failure to grow, it is simply not remembered (found the slow way). */
static void site_add(Core *c, const uint64_t *w, int n, uint64_t h, long long sid)
{
    if (c->sites == NULL || 2 * (c->sites_used + 1) > c->sites_mask + 1) {
        size_t cap = c->sites == NULL ? 64 : 2 * (c->sites_mask + 1);
        SiteSlot *grown = PyMem_Calloc(cap, sizeof *grown), *old = c->sites;
        if (grown == NULL)
            return;
        size_t old_cap = old == NULL ? 0 : c->sites_mask + 1;
        c->sites = grown;
        c->sites_mask = cap - 1;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].n)
                *site_find(c, old[i].w, old[i].n, old[i].hash) = old[i];
        PyMem_Free(old);
    }
    SiteSlot *s = site_find(c, w, n, h);
    if (s->n == 0) {
        s->hash = h;
        s->n = n;
        s->sid = sid;
        memcpy(s->w, w, n * sizeof *w);
        c->sites_used++;
    }
}

/* The innermost user frame at or above `f` and the innermost framework frame below it
 * (callsite.user_and_framework_frame), each a new reference or NULL; *code, the user
 * frame's code (new reference). -1 with an exception set, else 0. Steals `f`. */
static int user_and_framework_frame(Core *c, PyFrameObject *f, PyFrameObject **user,
                                    PyCodeObject **code, PyFrameObject **fw)
{
    *user = *fw = NULL;
    *code = NULL;
    while (f != NULL) {
        PyCodeObject *fc = PyFrame_GetCode(f);
        int framework = 0;
        int internal = code_internal(c, fc, *fw == NULL ? &framework : NULL);
        if (internal < 0) {
            Py_DECREF(fc);
            Py_DECREF(f);
            Py_CLEAR(*fw);
            return -1;
        }
        if (!internal) {
            *user = f;
            *code = fc;
            return 0;
        }
        Py_DECREF(fc);
        if (framework)
            *fw = (PyFrameObject *)Py_NewRef(f);
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    return 0;
}

/* The string id of the call site at user frame `f` (CallSites.of): found in this core's
 * table by its key's words, else interned by CallSites.at. -1 with an exception set. */
static long long site_of_frame(Core *c, PyFrameObject *f, PyCodeObject *code,
                               PyFrameObject *fw, int from_main)
{
    uint64_t w[SITE_WORDS];
    int n = site_words(c, f, code, fw, from_main, w);
    if (n < 0)
        return -1;
    uint64_t h = hash_words(w, n);
    SiteSlot *known = site_find(c, w, n, h);
    if (known != NULL && known->n)
        return known->sid;
    PyObject *k = site_key(w, n);
    if (k == NULL)
        return -1;
    long long r = -1;
    PyObject *site = PyDict_GetItemWithError(c->callsites, k);
    if (site != NULL && PyTuple_Check(site) && PyTuple_GET_SIZE(site) >= 1) {
        r = PyLong_AsLongLong(PyTuple_GET_ITEM(site, 0));
    } else if (!PyErr_Occurred()) {
        PyObject *sid = PyObject_CallFunctionObjArgs(
            c->callsite_miss, (PyObject *)f, k, c->callsites,
            fw != NULL ? (PyObject *)fw : Py_None, NULL);
        if (sid != NULL) {
            r = PyLong_AsLongLong(sid);
            Py_DECREF(sid);
        }
    }
    if (r >= 0 && !PyErr_Occurred()) {
        int held = PyDict_Contains(c->callsites, k);
        if (held == 1)
            site_add(c, w, n, h, r);
        else if (held < 0)
            PyErr_Clear();
    }
    Py_DECREF(k);
    return r == -1 || PyErr_Occurred() ? -1 : r;
}

/* The main thread's innermost frame (a new reference), or NULL (none; or an exception
 * set). Through sys._current_frames, which reads the thread states under the runtime's
 * lock, as callsite.main_thread_frames does. */
static PyFrameObject *main_thread_frame(Core *c)
{
    PyObject *current = PySys_GetObject("_current_frames"); /* borrowed */
    if (current == NULL)
        return NULL;
    PyObject *frames = PyObject_CallNoArgs(current);
    if (frames == NULL)
        return NULL;
    PyObject *ident = PyLong_FromUnsignedLong(c->main_ident), *f = NULL;
    if (ident != NULL && PyDict_Check(frames))
        f = PyDict_GetItemWithError(frames, ident);
    Py_XINCREF(f);
    Py_XDECREF(ident);
    Py_DECREF(frames);
    if (f != NULL && !PyFrame_Check(f))
        Py_CLEAR(f);
    return (PyFrameObject *)f;
}

/* The call site's string id (tracer/sites.py: CallSites.current); *from_main set when it
 * is the main thread's line (an op issued on a thread with no user frame: DDP's and
 * FSDP's hooks on autograd's threads take the line that called backward()). The walk
 * keeps the innermost framework frame below the user's (callsite.find_user_frame); on
 * the main thread's stack, the framework frame is the op's own thread's where it has
 * one. -1 on error. */
static long long callsite_id(Core *c, int *from_main)
{
    *from_main = 0;
    PyFrameObject *user, *fw, *main_fw = NULL;
    PyCodeObject *code;
    long long r = -1;
    if (user_and_framework_frame(c, (PyFrameObject *)Py_XNewRef(PyEval_GetFrame()), &user,
                                 &code, &fw) < 0)
        return -1;
    if (user != NULL) {
        r = site_of_frame(c, user, code, fw, 0);
    } else if (PyThread_get_thread_ident() == c->main_ident) {
        r = 0;
    } else {
        PyFrameObject *top = main_thread_frame(c);
        if (top == NULL && PyErr_Occurred())
            goto done;
        if (user_and_framework_frame(c, top, &user, &code, &main_fw) < 0)
            goto done;
        if (user == NULL) {
            r = 0;
        } else {
            r = site_of_frame(c, user, code, fw != NULL ? fw : main_fw, 1);
            *from_main = r >= 0;
        }
    }
done:
    Py_XDECREF(user);
    Py_XDECREF(code);
    Py_XDECREF(fw);
    Py_XDECREF(main_fw);
    return r;
}

/* The next sequence number of this op on group `pg` (per peer for p2p). */
static long long next_seq(Core *c, PyObject *pg, PyObject *spec, int p2p, PyObject *peer)
{
    if (!p2p) {
        long long seq = get_int_attr(pg, s_seq);
        if (seq == -1 && PyErr_Occurred())
            return -1;
        PyObject *next = PyLong_FromLongLong(seq + 1);
        if (next == NULL || PyObject_SetAttr(pg, s_seq, next) < 0) {
            Py_XDECREF(next);
            return -1;
        }
        Py_DECREF(next);
        return seq;
    }
    PyObject *table = PyObject_GetAttr(pg, s_p2p_seq), *op = NULL, *key = NULL, *next = NULL;
    long long seq = -1;
    if (table == NULL || !PyDict_Check(table))
        goto fail;
    op = PyObject_GetAttr(spec, s_op);
    if (op == NULL || (key = PyTuple_Pack(2, op, peer)) == NULL)
        goto fail;
    PyObject *old = PyDict_GetItemWithError(table, key);
    if (old == NULL && PyErr_Occurred())
        goto fail;
    long long have = old == NULL ? 0 : PyLong_AsLongLong(old);
    if (have == -1 && PyErr_Occurred())
        goto fail;
    if ((next = PyLong_FromLongLong(have + 1)) == NULL || PyDict_SetItem(table, key, next) < 0)
        goto fail;
    seq = have;
fail:
    if (seq < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "pg._dd_p2p_seq is not a dict");
    Py_XDECREF(table);
    Py_XDECREF(op);
    Py_XDECREF(key);
    Py_XDECREF(next);
    return seq;
}

/* reduce op number, root rank (new reference in *peer when read), async flag bits */
static int read_options(Core *c, PyObject *opts, int *redop, PyObject **peer, int *flags)
{
    PyObject *type = (PyObject *)Py_TYPE(opts);
    PyObject *fields = PyDict_GetItemWithError(c->fields, type);
    Py_XINCREF(fields);
    if (fields == NULL) {
        if (PyErr_Occurred() || (fields = PyObject_CallOneArg(c->fields_of, type)) == NULL)
            return -1;
    }
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) != 3) {
        Py_DECREF(fields);
        PyErr_SetString(PyExc_TypeError, "_fields_of must return 3 flags");
        return -1;
    }
    int has_redop = PyObject_IsTrue(PyTuple_GET_ITEM(fields, 0)) == 1;
    int has_root = PyObject_IsTrue(PyTuple_GET_ITEM(fields, 1)) == 1;
    int has_async = PyObject_IsTrue(PyTuple_GET_ITEM(fields, 2)) == 1;
    Py_DECREF(fields);
    if (has_redop) {
        PyObject *op = PyObject_GetAttr(opts, s_reduceOp);
        if (op == NULL)
            return -1;
        long long number;
        if (c->redop_reader == Py_None) {
            number = PyObject_Hash(op);
        } else {
            PyObject *n = PyObject_CallOneArg(c->redop_reader, op);
            number = n == NULL ? -1 : PyLong_AsLongLong(n);
            Py_XDECREF(n);
        }
        Py_DECREF(op);
        if (number == -1 && PyErr_Occurred())
            return -1;
        *redop = (int)number;
    }
    if (has_root && (*peer = PyObject_GetAttr(opts, s_rootRank)) == NULL)
        return -1;
    if (!has_async) { /* torch 2.6 and older: no async flag in options */
        *flags |= c->flag_async | c->flag_async_unknown;
    } else {
        PyObject *a = PyObject_GetAttr(opts, s_asyncOp);
        int yes = a == NULL ? -1 : PyObject_IsTrue(a);
        Py_XDECREF(a);
        if (yes < 0)
            return -1;
        if (yes)
            *flags |= c->flag_async;
    }
    return 0;
}

/* What an op is, read from its OpSpec once (TracedMethod) or per call (Core.begin). */
typedef struct {
    PyObject *spec; /* the OpSpec: passed to on_error, its .op read for p2p ops */
    PyObject *method; /* spec.method, for the token */
    int kind, code;
} OpInfo;

/* What Recorder.begin's token holds, kept in C: the event (-1: not written), whether
 * the op is on CUDA, and whether it is async (or of unknown asyncness). */
typedef struct {
    long long e;
    int on_cuda, async_op;
} Began;

/* Record an op entering (Recorder.begin): 0, or -1 with an exception set. `cpu`: 1 or 0
 * where the caller knows whether the op's first tensor is on the CPU, -1 where not. */
static int core_record(Core *c, PyObject *pg, const OpInfo *info, PyObject *ins,
                       PyObject *outs, PyObject *opts, PyObject *peer, int cpu, Began *out)
{
    PyObject *rooted = NULL;
    int rc = -1;
    PyObject *pending = PyObject_GetAttr(c->pending, s_pending);
    if (pending == NULL)
        return -1;
    int any = PyObject_IsTrue(pending);
    Py_DECREF(pending);
    if (any < 0)
        return -1;
    if (any) { /* earlier ops' completions, seen on the way in */
        PyObject *r = PyObject_CallMethodNoArgs(c->pending, s_check);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    int64_t t_enter = monotonic_ns();

    long long group_id = get_int_attr(pg, s_group_id);
    if (group_id == -1 && PyErr_Occurred())
        return -1;
    if (group_id == 0) {
        PyObject *g = PyObject_CallMethodOneArg(pg, s_describe, c->recorder);
        group_id = g == NULL ? -1 : PyLong_AsLongLong(g);
        Py_XDECREF(g);
        if (group_id == -1 && PyErr_Occurred())
            return -1;
    }
    long long seq = next_seq(c, pg, info->spec, info->kind == c->kind_p2p, peer);
    if (seq < 0)
        return -1;

    int redop = c->redop_none, flags = 0;
    if (opts != Py_None) {
        if (read_options(c, opts, &redop, &rooted, &flags) < 0)
            goto done;
        if (rooted != NULL)
            peer = rooted;
    } else {
        flags |= c->flag_async_unknown;
    }
    PyObject *tensors = PyList_GET_SIZE(ins) ? ins : outs;
    int on_cuda = 0;
    if (PyList_GET_SIZE(tensors)) {
        PyObject *first = PyList_GET_ITEM(tensors, 0);
        if (cpu < 0) {
            PyObject *v = PyObject_GetAttr(first, s_is_cpu);
            cpu = v == NULL ? -1 : PyObject_IsTrue(v);
            Py_XDECREF(v);
            if (cpu < 0)
                goto done;
        }
        if (!cpu) {
            PyObject *v = PyObject_GetAttr(first, s_is_cuda);
            on_cuda = v == NULL ? -1 : PyObject_IsTrue(v);
            Py_XDECREF(v);
            if (on_cuda < 0)
                goto done;
        }
    }
    int64_t one_numel = -1;
    long long tid = tensors_id(c, tensors, cpu == 1 && PyList_GET_SIZE(tensors) == 1,
                               &one_numel);
    if (tid == -1 && PyErr_Occurred())
        goto done;
    int from_main;
    long long site = callsite_id(c, &from_main);
    if (site == -1 && PyErr_Occurred())
        goto done;
    if (from_main || PyThread_get_thread_ident() != c->main_ident)
        flags |= c->flag_other_thread;
    int64_t numel_in = tensors == ins && one_numel >= 0 ? one_numel : numel_of(ins);
    if (numel_in < 0)
        goto done;
    int64_t numel_out = outs == ins ? numel_in
                        : tensors == outs && one_numel >= 0 ? one_numel : numel_of(outs);
    if (numel_out < 0)
        goto done;
    long long peer_rank = -1;
    if (peer != Py_None) {
        PyObject *as_int = PyNumber_Index(peer);
        peer_rank = as_int == NULL ? -1 : PyLong_AsLongLong(as_int);
        Py_XDECREF(as_int);
        if (peer_rank == -1 && PyErr_Occurred())
            goto done;
    }
    Py_ssize_t nspans = PyList_GET_SIZE(c->spans);
    long long span_index = 0;
    if (nspans) {
        span_index = PyLong_AsLongLong(PyList_GET_ITEM(c->spans, nspans - 1)) + 1;
        if (span_index == 0 && PyErr_Occurred())
            goto done;
    }
    Record rec = {info->kind, info->code, redop, flags, (uint32_t)group_id, (uint32_t)site,
                  (uint32_t)tid, 0, (uint64_t)seq, (uint64_t)span_index, (int32_t)peer_rank,
                  numel_in, numel_out, t_enter};
    long long e = slots_append((SlotWriter *)c->slots, &rec);
    if (e == LLONG_MIN)
        goto done;
    out->e = e;
    out->on_cuda = on_cuda;
    out->async_op = (flags & c->flag_async) || opts == Py_None;
    rc = 0;
done:
    Py_XDECREF(rooted);
    return rc;
}

/* Recorder.begin's token for `b`. */
static PyObject *token_of(const Began *b, PyObject *method)
{
    return Py_BuildValue("(LOOO)", b->e, b->on_cuda ? Py_True : Py_False,
                         b->async_op ? Py_True : Py_False, method);
}

/* begin failed with an Exception: report it to on_error (Python's warn_once) and carry
 * on with the op unrecorded. Anything else (KeyboardInterrupt) is left raised: -1. */
static int began_badly(Core *c, PyObject *spec)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1; /* KeyboardInterrupt and the like go on, as in Python */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *r = PyObject_CallFunctionObjArgs(c->on_error, spec, value, NULL);
    Py_XDECREF(r);
    PyErr_Clear();
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return 0;
}

static PyObject *Core_begin(Core *c, PyObject *const *args, Py_ssize_t n)
{
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, "begin(pg, spec, desc)");
        return NULL;
    }
    PyObject *spec = args[1], *desc = args[2];
    OpInfo info = {spec, NULL, 0, 0};
    Began b = {-1, 0, 0};
    PyObject *token = NULL;
    long long kind = -1, code = -1;
    if (!PyTuple_Check(desc) || PyTuple_GET_SIZE(desc) != 4) {
        PyErr_SetString(PyExc_TypeError, "desc must be (inputs, outputs, options, peer)");
        goto failed;
    }
    PyObject *ins = PyTuple_GET_ITEM(desc, 0), *outs = PyTuple_GET_ITEM(desc, 1);
    if (!PyList_Check(ins) || !PyList_Check(outs)) {
        PyErr_SetString(PyExc_TypeError, "inputs and outputs must be lists");
        goto failed;
    }
    if ((kind = get_int_attr(spec, s_kind)) == -1 && PyErr_Occurred())
        goto failed;
    if ((code = get_int_attr(spec, s_code)) == -1 && PyErr_Occurred())
        goto failed;
    if ((info.method = PyObject_GetAttr(spec, s_method)) == NULL)
        goto failed;
    info.kind = (int)kind;
    info.code = (int)code;
    if (core_record(c, args[0], &info, ins, outs, PyTuple_GET_ITEM(desc, 2),
                    PyTuple_GET_ITEM(desc, 3), -1, &b) == 0)
        token = token_of(&b, info.method);
    if (token != NULL) {
        Py_DECREF(info.method);
        return token;
    }
failed:
    Py_XDECREF(info.method);
    if (began_badly(c, spec) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* A synchronous CPU op: waited on here, in the caller's thread (recorder._wait_sync). */
/* The op of event e raised the exception that is set: record it (Recorder._finish) and
 * leave it set, for the caller. */
static void finish_raised(Core *c, long long e)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *e_obj = PyLong_FromLongLong(e);
    PyObject *f = e_obj && value ? PyObject_CallFunctionObjArgs(c->finish, e_obj, value, NULL)
                                 : NULL;
    Py_XDECREF(e_obj);
    Py_XDECREF(f);
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
}

static PyObject *wait_sync(Core *c, long long e, PyObject *work)
{
    PyObject *r = PyObject_CallMethodNoArgs(work, s_wait);
    if (r == NULL) {
        finish_raised(c, e);
        return NULL;
    }
    Py_DECREF(r);
    if (slots_complete((SlotWriter *)c->slots, e, c->status_ok, monotonic_ns(), 0) < 0)
        PyErr_Clear(); /* a closed log: nothing to record into */
    /* freed here, with the GIL, when the next op completes: see work.RecordingWork */
    Py_XSETREF(c->last_waited, Py_NewRef(work));
    return Py_NewRef(work);
}

static PyObject *Core_end(Core *c, PyObject *const *args, Py_ssize_t n)
{
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "end(token, work)");
        return NULL;
    }
    PyObject *token = args[0], *work = args[1];
    if (token == Py_None)
        return Py_NewRef(work);
    if (work != Py_None && PyTuple_Check(token) && PyTuple_GET_SIZE(token) == 4 &&
        PyTuple_GET_ITEM(token, 1) == Py_False && PyTuple_GET_ITEM(token, 2) == Py_False) {
        long long e = PyLong_AsLongLong(PyTuple_GET_ITEM(token, 0));
        if (!(e == -1 && PyErr_Occurred()))
            return wait_sync(c, e, work);
        PyErr_Clear();
    }
    return PyObject_CallFunctionObjArgs(c->end_other, token, work, NULL);
}

static PyMethodDef Core_methods[] = {
    {"begin", (PyCFunction)(void (*)(void))Core_begin, METH_FASTCALL,
     "begin(pg, spec, desc) -> token or None: Recorder.begin"},
    {"end", (PyCFunction)(void (*)(void))Core_end, METH_FASTCALL,
     "end(token, work) -> work: Recorder.end"},
    {NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "distdoctor.runlog._fast.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Recorder.begin/end in C (see recorder.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_methods = Core_methods,
};

/* ---------------------------------------------------------------- TracedMethod */

/* A TracingProcessGroup method (process_group.py) whose common case runs here, in one C
 * call: the op described, its backend's bound method found, the op recorded, issued and,
 * when synchronous on the CPU, waited on. Every other case (keyword arguments, no
 * recorder or no C core, an op routed through torch's dispatcher for its hooks, a device
 * or backend method not met before, barrier, monitored_barrier, coalesced ops) is the
 * Python method's, `slow`, which is also the reference: the same records, the same
 * results. The Python method is a plain function named as the method, which pybind11
 * needs to let it call the base method; this object is a method descriptor, not a
 * builtin function, so pybind11 takes it for a Python override and C++ callers (DDP's
 * reducer, functional collectives) reach it as they reach a Python method.
 *
 * Why: the Python method's frame, its *args, spec.describe, the bound-method look-up and
 * the token tuple cost ~1.5 us an op on top of the recorder (fake backend). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *slow;     /* the Python method */
    PyObject *spec;     /* its OpSpec */
    PyObject *method;   /* spec.method */
    PyObject *describe; /* spec.describe */
    PyObject *keys[2];  /* (method, "cpu"), (method, "cuda"): keys of pg._dd_bound */
    PyObject *state;    /* distdoctor.tracer.state's dict: its "recorder" */
    OpInfo info;
    int form;  /* FORM_* */
    int hooks; /* torch's groups may carry hooks (dispatch.HOOKS): see `hooked` */
} TracedMethod;

enum {
    FORM_SLOW = 0,     /* always the Python method */
    FORM_INPLACE = 1,  /* (tensors, opts): ops.py _inplace() */
    FORM_OUT_IN = 2,   /* (outputs, inputs, opts): ops.py _out_in() */
    FORM_DESCRIBE = 3, /* spec.describe(args, {}) */
};

static PyObject *s_recorder, *s_core, *s_dd_bound, *s_dd_hooked, *s_dd_torch_hooks,
    *s_describe_attr;
static PyObject *empty_kwargs;

/* The main thread is inside a traced op's C call (the sampler looks at nothing then,
 * as it does where the Python method's frame is on the main thread's stack). Changed and
 * read with the GIL held. */
static int main_in_op;

/* The recorder last seen in state.recorder, and its C core (NULL: it has none). */
static PyObject *seen_recorder, *seen_core;

static Core *active_core(PyObject *state)
{
    PyObject *rec = PyDict_GetItemWithError(state, s_recorder);
    if (rec == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (rec != seen_recorder) {
        PyObject *core = rec == Py_None ? NULL : PyObject_GetAttr(rec, s_core);
        if (core == NULL)
            PyErr_Clear();
        else if (!PyObject_TypeCheck(core, &CoreType))
            Py_CLEAR(core);
        Py_XSETREF(seen_core, core);
        Py_XSETREF(seen_recorder, Py_NewRef(rec));
    }
    return (Core *)seen_core;
}

/* ops.py _flat: the tensors in a tensor, a list of tensors or a list of lists, as a list
 * (a new reference; the caller's own list where it is one of tensors: only read). */
static PyObject *flat(PyObject *x)
{
    if (x == Py_None)
        return PyList_New(0);
    if (!PyList_Check(x) && !PyTuple_Check(x)) {
        PyObject *one = PyList_New(1);
        if (one != NULL)
            PyList_SET_ITEM(one, 0, Py_NewRef(x));
        return one;
    }
    if (PyList_CheckExact(x)) { /* a flat list (the common case) is read as it is */
        Py_ssize_t i = 0;
        while (i < PyList_GET_SIZE(x) && !PyList_Check(PyList_GET_ITEM(x, i)) &&
               !PyTuple_Check(PyList_GET_ITEM(x, i)))
            i++;
        if (i == PyList_GET_SIZE(x))
            return Py_NewRef(x);
    }
    PyObject *seq = PySequence_Fast(x, "");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int nested = 0;
    for (Py_ssize_t i = 0; i < n && !nested; i++)
        nested = PyList_Check(items[i]) || PyTuple_Check(items[i]);
    PyObject *out = PyList_New(nested ? 0 : n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *item = items[i];
        if (!nested) {
            PyList_SET_ITEM(out, i, Py_NewRef(item));
        } else if (PyList_Check(item) || PyTuple_Check(item)) {
            PyObject *more = PySequence_Fast(item, "");
            for (Py_ssize_t j = 0; more != NULL && j < PySequence_Fast_GET_SIZE(more); j++)
                if (PyList_Append(out, PySequence_Fast_GET_ITEM(more, j)) < 0)
                    Py_CLEAR(out);
            if (more == NULL)
                Py_CLEAR(out);
            Py_XDECREF(more);
        } else if (PyList_Append(out, item) < 0) {
            Py_CLEAR(out);
        }
    }
    Py_DECREF(seq);
    return out;
}

/* Whether the op must go through torch's dispatcher op for the group's hooks (the
 * Python method's `_dd_dispatch_call`): 1 yes, or not known yet (the Python method
 * finds out, and caches it in the group), 0 no, -1 error. */
static int hooked(PyObject *pg)
{
    PyObject *d = PyObject_GenericGetDict(pg, NULL);
    if (d == NULL)
        return -1;
    int r = 1;
    PyObject *own = PyDict_GetItemWithError(d, s_dd_hooked);
    if (own != NULL)
        r = PyObject_IsTrue(own);
    if (r == 0 || (own == NULL && !PyErr_Occurred())) {
        PyObject *torch_own = PyDict_GetItemWithError(d, s_dd_torch_hooks);
        r = torch_own != Py_False;
    }
    if (PyErr_Occurred())
        r = -1;
    Py_DECREF(d);
    return r;
}

static PyObject *TracedMethod_vectorcall(TracedMethod *m, PyObject *const *args,
                                         size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Core *c;
    if (m->form == FORM_SLOW || nargs < 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) ||
        (c = active_core(m->state)) == NULL)
        return PyObject_Vectorcall(m->slow, args, nargsf, kwnames);
    Py_INCREF(c); /* held across the Python this call may run (a new recorder meanwhile) */
    PyObject *pg = args[0], *const *a = args + 1;
    Py_ssize_t n = nargs - 1;
    PyObject *ins = NULL, *outs = NULL, *desc = NULL, *table = NULL, *bound = NULL;
    PyObject *opts = Py_None, *peer = Py_None, *work = NULL, *result = NULL;
    /* everything that can fail before the op is issued sends it to the Python method */
    if (m->form == FORM_INPLACE) {
        if ((ins = flat(n > 0 ? a[0] : Py_None)) == NULL)
            goto slow;
        outs = Py_NewRef(ins);
        opts = n > 1 ? a[1] : Py_None;
    } else if (m->form == FORM_OUT_IN) {
        if ((outs = flat(n > 0 ? a[0] : Py_None)) == NULL ||
            (ins = flat(n > 1 ? a[1] : Py_None)) == NULL)
            goto slow;
        opts = n > 2 ? a[2] : Py_None;
    } else {
        PyObject *t = PyTuple_New(n);
        if (t == NULL)
            goto slow;
        for (Py_ssize_t i = 0; i < n; i++)
            PyTuple_SET_ITEM(t, i, Py_NewRef(a[i]));
        desc = PyObject_CallFunctionObjArgs(m->describe, t, empty_kwargs, NULL);
        Py_DECREF(t);
        if (desc == NULL || !PyTuple_Check(desc) || PyTuple_GET_SIZE(desc) != 4 ||
            !PyList_Check(PyTuple_GET_ITEM(desc, 0)) || !PyList_Check(PyTuple_GET_ITEM(desc, 1)))
            goto slow;
        ins = Py_NewRef(PyTuple_GET_ITEM(desc, 0));
        outs = Py_NewRef(PyTuple_GET_ITEM(desc, 1));
        opts = PyTuple_GET_ITEM(desc, 2);
        peer = PyTuple_GET_ITEM(desc, 3);
    }
    /* the backend's bound method, as TracingProcessGroup._dd_backend_call finds it */
    PyObject *tensors = PyList_GET_SIZE(ins) ? ins : outs;
    if (!PyList_GET_SIZE(tensors))
        goto slow; /* barrier: its device is the group's to choose */
    PyObject *v = PyObject_GetAttr(PyList_GET_ITEM(tensors, 0), s_is_cpu);
    int cpu = v == NULL ? -1 : PyObject_IsTrue(v);
    Py_XDECREF(v);
    if (cpu < 0)
        goto slow;
    int key = 0;
    if (!cpu) {
        v = PyObject_GetAttr(PyList_GET_ITEM(tensors, 0), s_is_cuda);
        int cuda = v == NULL ? -1 : PyObject_IsTrue(v);
        Py_XDECREF(v);
        if (cuda != 1)
            goto slow; /* another device: its type is read the Python way */
        key = 1;
    }
    if (m->hooks && hooked(pg) != 0)
        goto slow;
    if ((table = PyObject_GetAttr(pg, s_dd_bound)) == NULL || !PyDict_Check(table))
        goto slow;
    if ((bound = PyDict_GetItemWithError(table, m->keys[key])) == NULL)
        goto slow; /* not met yet: the Python method binds it */
    Py_INCREF(bound);

    Began b = {-1, 0, 0};
    int recorded = 1;
    if (core_record(c, pg, &m->info, ins, outs, opts, peer, cpu, &b) < 0) {
        if (began_badly(c, m->spec) < 0)
            goto out;
        recorded = 0;
    }
    int on_main = PyThread_get_thread_ident() == c->main_ident;
    main_in_op += on_main;
    work = PyObject_Vectorcall(bound, a, n, NULL);
    if (work == NULL) {
        if (recorded)
            finish_raised(c, b.e);
    } else if (!recorded) {
        result = Py_NewRef(work);
    } else if (work != Py_None && !b.on_cuda && !b.async_op) {
        result = wait_sync(c, b.e, work);
    } else {
        PyObject *token = token_of(&b, m->method);
        if (token != NULL)
            result = PyObject_CallFunctionObjArgs(c->end_other, token, work, NULL);
        Py_XDECREF(token);
        if (result == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear(); /* never raise our own failure into the job */
            result = Py_NewRef(work);
        }
    }
    main_in_op -= on_main;
    goto out;
slow:
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception))
        goto out; /* KeyboardInterrupt and the like go on */
    PyErr_Clear();
    result = PyObject_Vectorcall(m->slow, args, nargsf, kwnames);
out:
    Py_DECREF(c);
    Py_XDECREF(ins);
    Py_XDECREF(outs);
    Py_XDECREF(desc);
    Py_XDECREF(table);
    Py_XDECREF(bound);
    Py_XDECREF(work);
    return result;
}

static int TracedMethod_init(TracedMethod *m, PyObject *args, PyObject *kw)
{
    static char *names[] = {"slow", "spec", "form", "state", "hooks", NULL};
    PyObject *slow, *spec, *state;
    int form, hooks;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOiO!p", names, &slow, &spec, &form,
                                     &PyDict_Type, &state, &hooks))
        return -1;
    if (m->slow != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "TracedMethod initialised twice");
        return -1;
    }
    long long kind = get_int_attr(spec, s_kind), code;
    if (kind == -1 && PyErr_Occurred())
        return -1;
    if ((code = get_int_attr(spec, s_code)) == -1 && PyErr_Occurred())
        return -1;
    PyObject *method = PyObject_GetAttr(spec, s_method);
    PyObject *describe = method ? PyObject_GetAttr(spec, s_describe_attr) : NULL;
    PyObject *cpu = describe ? Py_BuildValue("(Os)", method, "cpu") : NULL;
    PyObject *cuda = cpu ? Py_BuildValue("(Os)", method, "cuda") : NULL;
    if (cuda == NULL) {
        Py_XDECREF(method);
        Py_XDECREF(describe);
        Py_XDECREF(cpu);
        return -1;
    }
    m->slow = Py_NewRef(slow);
    m->spec = Py_NewRef(spec);
    m->method = method;
    m->describe = describe;
    m->keys[0] = cpu;
    m->keys[1] = cuda;
    m->state = Py_NewRef(state);
    m->info = (OpInfo){spec, method, (int)kind, (int)code};
    m->form = form;
    m->hooks = hooks;
    m->vectorcall = (vectorcallfunc)TracedMethod_vectorcall;
    return 0;
}

static int TracedMethod_traverse(TracedMethod *m, visitproc visit, void *arg)
{
    Py_VISIT(m->slow);
    Py_VISIT(m->spec);
    Py_VISIT(m->method);
    Py_VISIT(m->describe);
    Py_VISIT(m->keys[0]);
    Py_VISIT(m->keys[1]);
    Py_VISIT(m->state);
    return 0;
}

static int TracedMethod_clear(TracedMethod *m)
{
    m->form = FORM_SLOW;
    m->info.spec = m->info.method = NULL;
    Py_CLEAR(m->spec);
    Py_CLEAR(m->method);
    Py_CLEAR(m->describe);
    Py_CLEAR(m->keys[0]);
    Py_CLEAR(m->keys[1]);
    Py_CLEAR(m->state);
    return 0;
}

static void TracedMethod_dealloc(TracedMethod *m)
{
    PyObject_GC_UnTrack(m);
    TracedMethod_clear(m);
    Py_CLEAR(m->slow);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *TracedMethod_call(PyObject *m, PyObject *args, PyObject *kw)
{
    if (((TracedMethod *)m)->slow == NULL) {
        PyErr_SetString(PyExc_TypeError, "TracedMethod not initialised");
        return NULL;
    }
    return PyVectorcall_Call(m, args, kw);
}

/* As a function is: looked up on an instance, a bound method (what pybind11 unwraps to
 * find this object, and takes for a Python override). */
static PyObject *TracedMethod_get(PyObject *m, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(m);
    return PyMethod_New(m, obj);
}

/* __name__, __doc__, __code__, ... are the Python method's. */
static PyObject *TracedMethod_getattro(PyObject *m, PyObject *name)
{
    static const char *const own[] = {"__doc__", "__name__", "__qualname__", "__module__",
                                      "__code__", "__defaults__", "__kwdefaults__",
                                      "__annotations__", "__dict__", NULL};
    for (int i = 0; own[i] != NULL && ((TracedMethod *)m)->slow != NULL; i++)
        if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, own[i]) == 0)
            return PyObject_GetAttr(((TracedMethod *)m)->slow, name);
    PyObject *r = PyObject_GenericGetAttr(m, name);
    if (r != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError) ||
        ((TracedMethod *)m)->slow == NULL)
        return r;
    PyErr_Clear();
    return PyObject_GetAttr(((TracedMethod *)m)->slow, name);
}

static PyMemberDef TracedMethod_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(TracedMethod, slow), READONLY,
     "the Python method: the reference, and the path of every case this one leaves"},
    {NULL},
};

static PyTypeObject TracedMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "distdoctor.runlog._fast.TracedMethod",
    .tp_basicsize = sizeof(TracedMethod),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "A traced ProcessGroup method's common case in C (see _fast.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)TracedMethod_init,
    .tp_dealloc = (destructor)TracedMethod_dealloc,
    .tp_traverse = (traverseproc)TracedMethod_traverse,
    .tp_clear = (inquiry)TracedMethod_clear,
    .tp_vectorcall_offset = offsetof(TracedMethod, vectorcall),
    .tp_call = TracedMethod_call,
    .tp_descr_get = TracedMethod_get,
    .tp_getattro = TracedMethod_getattro,
    .tp_members = TracedMethod_members,
};

/* ------------------------------------------------------------------ shrink guard */
/* A store into a log's shared map past the end of a file another process truncated is
 * SIGBUS, and kills the rank (runlog/shrink.py). No unprivileged means keeps the file's
 * size, and any check before a store leaves a window, so the fault itself is caught: in a
 * registered log's map, the map becomes anonymous memory at the same address (one mmap,
 * async-signal-safe as a system call) and the store runs again into it; the log ends
 * there. Any other SIGBUS goes to the action that was there before, with the same
 * arguments, as if this one were not installed (a kill()'s SIGBUS raised again under the
 * default action). A handler installed after this one, that does not chain, is first:
 * the rank is then as exposed as without distdoctor, never more. */
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>

#define GUARD_MAPS 64
static struct {
    char *base; /* NULL: a free entry (atomic: the handler reads it on any thread) */
    size_t size;
    int hit;
} guard_maps[GUARD_MAPS];
static struct sigaction guard_prev;
static int guard_installed;

static void guard_on_bus(int sig, siginfo_t *info, void *ctx)
{
    int saved_errno = errno; /* (mmap may set it under the interrupted code) */
    if (info != NULL && info->si_code > 0) { /* a fault, not a kill() */
        char *addr = (char *)info->si_addr;
        for (int i = 0; i < GUARD_MAPS; i++) {
            char *base = __atomic_load_n(&guard_maps[i].base, __ATOMIC_ACQUIRE);
            size_t size = guard_maps[i].size;
            if (base != NULL && addr >= base && addr < base + size) {
                if (mmap(base, size, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != (void *)base)
                    break;
                __atomic_store_n(&guard_maps[i].hit, 1, __ATOMIC_RELEASE);
                errno = saved_errno;
                return;
            }
        }
    }
    if (guard_prev.sa_flags & SA_SIGINFO) {
        guard_prev.sa_sigaction(sig, info, ctx);
    } else if (guard_prev.sa_handler == SIG_DFL) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(sig, &dfl, NULL); /* a fault comes again on return, and kills */
        if (info == NULL || info->si_code <= 0)
            raise(sig); /* (pending until this handler returns) */
    } else if (guard_prev.sa_handler != SIG_IGN) {
        guard_prev.sa_handler(sig);
    }
    errno = saved_errno;
}

/* guard_map(address, size) -> entry, or -1 (no room, or no handler) */
static PyObject *module_guard_map(PyObject *mod, PyObject *args)
{
    unsigned long long addr, size;
    if (!PyArg_ParseTuple(args, "KK", &addr, &size))
        return NULL;
    if (!guard_installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = guard_on_bus;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &guard_prev) != 0)
            return PyLong_FromLong(-1);
        guard_installed = 1;
    }
    for (int i = 0; i < GUARD_MAPS; i++) {
        if (guard_maps[i].base == NULL) {
            guard_maps[i].size = (size_t)size;
            guard_maps[i].hit = 0;
            __atomic_store_n(&guard_maps[i].base, (char *)(uintptr_t)addr, __ATOMIC_RELEASE);
            return PyLong_FromLong(i);
        }
    }
    return PyLong_FromLong(-1);
}

/* guard_unmap(entry) -> whether a fault was caught in it; before the map is closed */
static PyObject *module_guard_unmap(PyObject *mod, PyObject *args)
{
    int i;
    if (!PyArg_ParseTuple(args, "i", &i))
        return NULL;
    if (i < 0 || i >= GUARD_MAPS)
        Py_RETURN_FALSE;
    __atomic_store_n(&guard_maps[i].base, NULL, __ATOMIC_RELEASE);
    return PyBool_FromLong(__atomic_load_n(&guard_maps[i].hit, __ATOMIC_ACQUIRE));
}

/* guard_hit(entry) -> whether a fault was caught in it (the log ended there) */
static PyObject *module_guard_hit(PyObject *mod, PyObject *args)
{
    int i;
    if (!PyArg_ParseTuple(args, "i", &i))
        return NULL;
    return PyBool_FromLong(i >= 0 && i < GUARD_MAPS &&
                           __atomic_load_n(&guard_maps[i].hit, __ATOMIC_ACQUIRE));
}

static PyObject *module_main_in_op(PyObject *mod, PyObject *unused)
{
    return PyBool_FromLong(main_in_op > 0);
}

static PyMethodDef module_methods[] = {
    {"main_in_op", module_main_in_op, METH_NOARGS,
     "whether the main thread is inside a traced op's C call (TracedMethod)"},
    {"guard_map", module_guard_map, METH_VARARGS,
     "guard_map(address, size): a log's map whose SIGBUS ends the log (see _fast.c)"},
    {"guard_unmap", module_guard_unmap, METH_VARARGS,
     "guard_unmap(entry): before the map is closed; whether a fault was caught in it"},
    {"guard_hit", module_guard_hit, METH_VARARGS,
     "guard_hit(entry): whether a fault was caught in the map (the log ended there)"},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "distdoctor.runlog._fast",
    "The event log's slot writer and the tracer's hot path in C (see _fast.c; "
    "runlog/slots.py and tracer/recorder.py are the reference).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fast(void)
{
    struct { PyObject **at; const char *text; } names[] = {
        {&s_pending, "_pending"}, {&s_check, "check"}, {&s_group_id, "_dd_group_id"},
        {&s_describe, "_dd_describe"}, {&s_seq, "_dd_seq"}, {&s_p2p_seq, "_dd_p2p_seq"},
        {&s_kind, "kind"}, {&s_op, "op"}, {&s_code, "code"}, {&s_method, "method"},
        {&s_reduceOp, "reduceOp"}, {&s_rootRank, "rootRank"}, {&s_asyncOp, "asyncOp"},
        {&s_shape, "shape"}, {&s_dtype, "dtype"}, {&s_device, "device"},
        {&s_is_cuda, "is_cuda"}, {&s_is_cpu, "is_cpu"}, {&s_numel, "numel"}, {&s_wait, "wait"},
        {&s_last_waited, "_last_waited"}, {&s_recorder, "recorder"}, {&s_core, "_core"},
        {&s_dd_bound, "_dd_bound"}, {&s_dd_hooked, "_dd_hooked"},
        {&s_dd_torch_hooks, "_dd_torch_hooks"}, {&s_describe_attr, "describe"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].at = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    if (PyType_Ready(&SlotWriterType) < 0 || PyType_Ready(&CoreType) < 0 ||
        PyType_Ready(&TracedMethodType) < 0 || (empty_kwargs = PyDict_New()) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "SlotWriter", (PyObject *)&SlotWriterType) < 0 ||
        PyModule_AddObjectRef(m, "Core", (PyObject *)&CoreType) < 0 ||
        PyModule_AddObjectRef(m, "TracedMethod", (PyObject *)&TracedMethodType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
