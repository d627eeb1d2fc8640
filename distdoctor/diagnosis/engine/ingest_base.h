/* The engine's C ingest (_ingest.c), its base: the classes it reads by offset, the
 * settings configure() gives, the interned strings, the engine's parts read once a call,
 * how a failure is said, and small helpers on dicts and tuples. Included by _ingest.c
 * alone (one translation unit: every name here is static). */
#ifndef DISTDOCTOR_INGEST_BASE_H
#define DISTDOCTOR_INGEST_BASE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>

#include "slot_fields.h"

/* --- the classes read by offset ----------------------------------------------------- */
enum { E_RANK, E_INDEX, E_KIND, E_OP, E_STATUS, E_GROUP, E_DESC, E_GROUP_RANKS, E_SEQ,
       E_PEER, E_DTYPES, E_NUMEL_IN, E_NUMEL_OUT, E_REDOP, E_CALLSITE, E_ENTER, E_END,
       E_SPAN, E_N };
static const char *EVENT_F[] = {"rank", "index", "kind", "op", "status", "group",
    "group_desc", "group_ranks", "seq", "peer", "dtypes", "numel_in", "numel_out",
    "reduce_op", "callsite", "t_enter_ns", "t_end_ns", "span_index"};
enum { R_KEY, R_GROUP, R_DESC, R_SEQ, R_MEMBERS, R_FIRST_SEEN, R_ARRIVALS, R_DONE,
       R_FIRST_RAW, R_FIRST_SIG, R_MISMATCH, R_REPORTED, R_N };
static const char *RV_F[] = {"key", "group", "group_desc", "seq", "members",
    "first_seen_s", "arrivals", "done", "first_raw", "first_sig", "mismatch_since_s",
    "reported"};
enum { S_LATEST, S_LAST_DONE, S_ISSUED, S_MAX_T, S_COMPLETED, S_RECENT, S_NAMES, S_N };
static const char *RANK_F[] = {"latest", "last_done", "issued", "max_t_ns", "completed",
    "recent", "names"};
enum { T_WALL, T_COLL, T_DATA, T_BATCHES, T_FIRST_ENTER, T_LABEL, T_SAMPLES, T_RUNQ,
       T_BY_GROUP, T_CHILDREN, T_N };
static const char *STEP_F[] = {"wall_ms", "coll_ms", "data_ms", "batches",
    "first_enter_ns", "label", "samples", "runq_ms", "by_group", "children"};
enum { ST_TOTALS, ST_FIRST, ST_OLD_KEYS, ST_OLD_SUMS, ST_N };
static const char *STEPS_F[] = {"totals", "first", "old_keys", "old_sums"};
enum { RS_STEPS, RS_PATTERN, RS_GROUP_DESC, RS_TURNS, RS_PERIOD, RS_LAST_SAMPLE, RS_LOOSE,
       RS_N };
static const char *RANKSTEPS_F[] = {"steps", "pattern", "group_desc", "_turns",
    "sample_period_ms", "_last_sample_ns", "loose"};
enum { P_PERIOD, P_COUNT, P_START, P_TURNS0, P_N };
static const char *PATTERN_F[] = {"period", "count", "start", "turns0"};

static Layout L_EVENT = {EVENT_F, E_N}, L_RV = {RV_F, R_N}, L_RANK = {RANK_F, S_N},
              L_STEP = {STEP_F, T_N}, L_STEPS = {STEPS_F, ST_N},
              L_RANKSTEPS = {RANKSTEPS_F, RS_N}, L_PATTERN = {PATTERN_F, P_N};

/* --- settings (configure) ----------------------------------------------------------- */
static int configured;
static Py_ssize_t MAX_OPEN, KEEP, STEPS, LONG_STEPS, MAX_KEYS, MAX_GROUPS, MAX_SITES,
    GAPS_KEEP, GAPS_SITES, ALL_FIRST, EVERY;
static PyObject *COUNTER;       /* collections.Counter (a sample's lines are counted) */
static long long PATTERN_BASE;  /* steptime.Pattern: a found turn's key is -BASE - turn */
static double LONG_WAIT_MIN_S;
static PyObject *NO_WORDS;      /* waitgraph._NO_WORDS */

static PyObject *s_collective, *s_ok, *s_in_flight, *s_undefined, *s_c, *s_hang, *s_long_wait,
    *s_thread_id, *s_file, *s_line, *s_waiting, *s_waits, *s_straggler, *s_ingest,
    *s_append, *s_popitem, *s_frombytes, *s_ingest_one, *s_failed, *s_observe, *s_completed,
    *s_agreed, *s_observer, *s_place, *s_op, *s_sample, *s_function, *s_step_times,
    *s_locals, *s_quiet;
static PyObject *f_zero, *i_zero, *i_one;  /* 0.0, 0, 1 */

/* A string field equal to an interned constant (the decoder's strings are its caches'). */
static inline int str_is(PyObject *o, PyObject *s)
{
    return o == s || (o != NULL && PyUnicode_CheckExact(o) && PyUnicode_Compare(o, s) == 0);
}

/* An exact int's value; *bad set for anything else (NULL, None, a subclass, too big). */
static inline long long as_ll(PyObject *o, int *bad)
{
    if (o == NULL || !PyLong_CheckExact(o)) {
        *bad = 1;
        return 0;
    }
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
    /* CPython 3.11's digits read in place: an event carries ~25 ints through the path
     * (clock readings take two digits), and the call below cost more than the reading */
    Py_ssize_t size = Py_SIZE(o);
    if (size >= -2 && size <= 2) {
        const digit *d = ((PyLongObject *)o)->ob_digit;
        long long m = size == 0 ? 0 : (long long)d[0];
        if (size == 2 || size == -2)
            m += (long long)d[1] << PyLong_SHIFT;
        return size < 0 ? -m : m;
    }
#endif
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        *bad = 1;
    }
    return v;
}

/* Clock readings and counters the common path takes: their sums and differences stay
 * inside 64 bits (Python's ints have no bound; a reading past this is a corrupt log's). */
#define T_MAX (1LL << 61)

/* --- the engine's parts, read once a call ------------------------------------------ */
enum { C_RANKS, C_OPEN, C_FOUND, C_SITE_WAIT, C_OFF, C_STRAGGLER, C_OBS, C_SSTEPS,
       C_MEMBERS, C_EDGES, C_VIA, C_TIMES, C_STEPTIME, C_ST_RANKS, C_KEYS, C_ASSIGNED,
       C_TURN, C_THREAD, C_SEEN, C_USERS, C_OF, C_FLAGGED, C_GAPS_OPEN, C_GAPS_BEFORE,
       C_GAPS_LAST, C_GAPS_MOVED, C_GAPS_SEEN,
       C_THREAD_LAST, C_HABITS, C_HABITS_COUNT, C_GRAPH, C_GRAPH_KEEP, C_N };
static const char *CTX_PATHS[C_N] = {"ranks", "open", "found", "site_wait", "boundary.off",
    "straggler", "straggler.obs", "straggler.steps", "straggler.members",
    "straggler.graph.edges", "straggler.graph.via", "straggler.activity.times", "steptime",
    "steptime.ranks", "steptime._keys", "steptime._assigned", "steptime._turn",
    "steptime.thread", "steptime.thread.seen", "steptime.thread.users",
    "steptime.thread.of", "steptime.thread.flagged", "gaps.open", "gaps.before",
    "gaps.last", "gaps.moved_ns", "gaps.seen_ns",
    "thread_use._last", "habits", "habits._count", "straggler.graph", "straggler.graph.keep"};

typedef struct {
    PyObject *engine, *now;
    PyObject *o[C_N];   /* strong references */
    Py_ssize_t graph_keep;
    int waits_on;
} Ctx;

static void ctx_clear(Ctx *c)
{
    for (int i = 0; i < C_N; i++)
        Py_CLEAR(c->o[i]);
}

static PyObject *resolve(PyObject *root, const char *path)
{
    PyObject *o = Py_NewRef(root);
    char part[64];
    while (*path && o != NULL) {
        size_t n = strcspn(path, ".");
        if (n >= sizeof part) {
            Py_DECREF(o);
            PyErr_SetString(PyExc_ValueError, "path part too long");
            return NULL;
        }
        memcpy(part, path, n);
        part[n] = 0;
        PyObject *next = PyObject_GetAttrString(o, part);
        Py_DECREF(o);
        o = next;
        path += n + (path[n] == '.');
    }
    return o;
}

/* 0, or -1 with an error set (the engine lacks a part: the Python path is used). */
static int ctx_load(Ctx *c)
{
    ctx_clear(c);
    for (int i = 0; i < C_N; i++)
        if ((c->o[i] = resolve(c->engine, CTX_PATHS[i])) == NULL)
            return -1;
    for (int i = 0; i < C_GRAPH_KEEP; i++) {
        PyObject *o = c->o[i];
        if (i == C_STRAGGLER || i == C_STEPTIME || i == C_THREAD || i == C_HABITS ||
            i == C_GRAPH)
            continue;
        int ordered = i == C_KEYS || i == C_FLAGGED;
        if (i == C_OFF ? !PyAnySet_Check(o) : ordered ? !PyDict_Check(o)
                                                     : !PyDict_CheckExact(o)) {
            PyErr_Format(PyExc_TypeError, "engine part %s of an unexpected type",
                         CTX_PATHS[i]);
            return -1;
        }
    }
    c->graph_keep = PyLong_AsSsize_t(c->o[C_GRAPH_KEEP]);
    if (PyErr_Occurred())
        return -1;
    int off = PySet_Contains(c->o[C_OFF], s_waits);
    if (off < 0)
        return -1;
    c->waits_on = !off;
    return 0;
}

/* A failure, said by the engine (its boundary) as it says ingest_one's; -1 if even that
 * failed. */
static int failed(Ctx *c, PyObject *where)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (exc != NULL && tb != NULL)
        PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
#endif
    if (exc == NULL)  /* (every failure here sets one; this says it if one did not) */
        exc = PyObject_CallFunction(PyExc_RuntimeError, "s", "C ingest: failed, unsaid");
    if (exc == NULL)
        return -1;
    PyObject *r = PyObject_CallMethodObjArgs(c->engine, s_failed, exc, where, NULL);
    Py_XDECREF(exc);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Call engine.<part>.<method>(arg) for a rare case; its failure is said for `where`. */
static int call_part(Ctx *c, PyObject *obj, PyObject *method, PyObject *arg, PyObject *where)
{
    PyObject *r = PyObject_CallMethodOneArg(obj, method, arg);
    if (r != NULL) {
        Py_DECREF(r);
        return 0;
    }
    return failed(c, where);
}

/* --- the per-step tables: dicts, oldest first (stragglers.drop_oldest) ------------- */

/* Where a per-step table's oldest entry was last taken from (a dict's slot number, as
 * PyDict_Next counts them), by the table's address; a slot shared by two tables makes
 * one of them search from the start again. */
typedef struct {
    PyObject *table;
    Py_ssize_t next;
} Front;
static Front fronts[512];

/* The oldest entry of a dict (borrowed) and the slot after it; 0 when empty. A dict
 * keeps its entries in a table of slots in the order they were put; a dropped key's slot
 * stays empty until the dict grows or shrinks and packs them. From the start, the
 * search passes every slot emptied since the last packing (a table of 160 steps: 90 on
 * average), so it begins where the last one ended when that is safe: in a table whose
 * keys are only ever dropped oldest first (`front_only`: the per-step tables, through
 * this and stragglers.drop_oldest), every slot before an empty one is empty. A slot
 * found full there (the dict was packed), or none found, sends the search to the start. */
static int dict_oldest(PyObject *d, int front_only, PyObject **k, PyObject **v)
{
    Front *f = &fronts[((uintptr_t)d >> 5) % (sizeof fronts / sizeof *fronts)];
    Py_ssize_t pos = 0;
    if (front_only && f->table == d && f->next > 0) {
        Py_ssize_t from = f->next - 1, at = from;
        if (PyDict_Next(d, &at, k, v) && at - 1 > from) {
            f->next = at;
            return 1;
        }
    }
    if (!PyDict_Next(d, &pos, k, v))
        return 0;
    if (front_only)
        *f = (Front){d, pos};
    return 1;
}

/* Remove the table's oldest entry; with `key` and `value`, hand them over (new
 * references). A dict's by dict_oldest; a mapping of another kind (an OrderedDict put
 * there by hand) is asked with its own popitem(last=False). */
static int pop_oldest(PyObject *t, int front_only, PyObject **key, PyObject **value)
{
    PyObject *k, *v;
    if (PyDict_CheckExact(t)) {
        if (!dict_oldest(t, front_only, &k, &v)) {
            PyErr_SetString(PyExc_KeyError, "the oldest of an empty table");
            return -1;
        }
        Py_INCREF(k);
        Py_INCREF(v);
        if (PyDict_DelItem(t, k) < 0) {
            Py_DECREF(k);
            Py_DECREF(v);
            return -1;
        }
    } else {
        PyObject *pair = PyObject_CallMethodOneArg(t, s_popitem, Py_False);
        if (pair == NULL)
            return -1;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            Py_DECREF(pair);
            PyErr_SetString(PyExc_TypeError, "popitem: not a pair");
            return -1;
        }
        k = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
        v = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
        Py_DECREF(pair);
    }
    if (key != NULL) {
        *key = k;
        *value = v;
    } else {
        Py_DECREF(k);
        Py_DECREF(v);
    }
    return 0;
}

/* mapping.get(key) for any mapping: a new reference, NULL for missing (no error) or on
 * an error (set). A dict subclass (an OrderedDict) is read as the dict it is: only its
 * writes must go through its own methods, and a missing key costs no KeyError. */
static PyObject *mget(PyObject *m, PyObject *key)
{
    if (PyDict_Check(m))
        return Py_XNewRef(PyDict_GetItemWithError(m, key));
    PyObject *v = PyObject_GetItem(m, key);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_KeyError))
        PyErr_Clear();
    return v;
}

/* q.append(x) (a deque's through its method, looked up once: each call's lookup by
 * name was a hundredth of the ingest; anything else by name); 0, or -1 with an error. */
static PyObject *DEQUE, *DEQUE_APPEND;  /* collections.deque, deque.append */
static int append_to(PyObject *q, PyObject *x)
{
    PyObject *r;
    if (Py_IS_TYPE(q, (PyTypeObject *)DEQUE)) {
        PyObject *args[2] = {q, x};
        r = PyObject_Vectorcall(DEQUE_APPEND, args, 2, NULL);
    } else {
        r = PyObject_CallMethodOneArg(q, s_append, x);
    }
    Py_XDECREF(r);
    return r ? 0 : -1;
}

static PyObject *pair(PyObject *a, PyObject *b) { return PyTuple_Pack(2, a, b); }
static PyObject *triple(PyObject *a, PyObject *b, PyObject *c) { return PyTuple_Pack(3, a, b, c); }

static inline long long floor_div(long long a, long long b)
{
    long long q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* dict.get(key) is exactly the int 0 (the main thread's id, beside.py MAIN). */
static int is_zero(PyObject *d, PyObject *key)
{
    PyObject *v = mget(d, key);
    int bad = 0;
    int zero = v != NULL && as_ll(v, &bad) == 0 && !bad;
    Py_XDECREF(v);
    return zero;
}

/* counter[key] += 1 (a Counter is a dict whose missing keys count 0) */
static int count_one(PyObject *counter, PyObject *key)
{
    PyObject *had = PyDict_GetItemWithError(counter, key);
    if (had == NULL && PyErr_Occurred())
        return -1;
    PyObject *n = had ? PyNumber_Add(had, i_one) : Py_NewRef(i_one);
    int rc = n ? PyDict_SetItem(counter, key, n) : -1;
    Py_XDECREF(n);
    return rc;
}

/* A callsite's value, None where it has none (dict.get). */
static PyObject *site_get(PyObject *cs, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(cs, name);
    return v ? v : PyErr_Occurred() ? NULL : Py_None;
}

#endif
