/* The diagnosis engine's ingest of the common event in C: a collective of a rank's main
 * thread (finished, or in flight and then its end), its rendezvous completed with every
 * member agreeing; and the main thread's sampled lines between ops.
 *
 * engine/core.py's Engine.ingest_one is the reference: this is its common path written
 * out against the same Python objects (the engine's dictionaries, the rendezvous, the
 * straggler tracker's and the step accounting's state), in the same order, so every
 * reader (the detectors, the views, the exporters) finds what the Python path would have
 * left. Anything else (a span, p2p, a user thread's op, a rank's first op, a new group
 * name, a disagreement, an op read in flight twice) is handed to ingest_one
 * before anything of the event is changed; the rare parts of a completion (a long wait, a
 * rank beside its step, a group's habits sampled) call the Python code that owns them.
 *
 * Why C: the Python ingest cost ~7 us an event, where `distdoctor run` may spend ~2 us an
 * event in all at 2 ranks x 1,000 collectives/s (issue 49: 1% of a core). The interpreter
 * was most of it (compiling the same modules with mypyc gained 4%: their values are not
 * native); the objects stay, so nothing that reads them changes.
 *
 * configure(settings)               once (fastpath.py): the engine's classes and limits
 * ingest(engine, events, now_s) -> n  every event ingested, n of them here; a failure
 *     (here or in ingest_one) goes to engine._feed_failed(exc, where): that event's.
 */
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
    *s_append, *s_popitem, *s_ingest_one, *s_failed, *s_observe, *s_completed,
    *s_agreed, *s_observer, *s_place, *s_op, *s_sample, *s_function, *s_step_times,
    *s_locals;
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
       C_THREAD_LAST, C_HABITS, C_HABITS_COUNT, C_GRAPH, C_WINDOW, C_GRAPH_KEEP, C_N };
static const char *CTX_PATHS[C_N] = {"ranks", "open", "found", "site_wait", "boundary.off",
    "straggler", "straggler.obs", "straggler.steps", "straggler.members",
    "straggler.graph.edges", "straggler.graph.via", "straggler.activity.times", "steptime",
    "steptime.ranks", "steptime._keys", "steptime._assigned", "steptime._turn",
    "steptime.thread", "steptime.thread.seen", "steptime.thread.users",
    "steptime.thread.of", "steptime.thread.flagged", "gaps.open", "gaps.before",
    "gaps.last", "gaps.moved_ns", "gaps.seen_ns",
    "thread_use._last", "habits", "habits._count", "straggler.graph", "straggler.window",
    "straggler.graph.keep"};

typedef struct {
    PyObject *engine, *now;
    PyObject *o[C_N];   /* strong references */
    Py_ssize_t window, graph_keep;
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
    for (int i = 0; i < C_WINDOW; i++) {
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
    c->window = PyLong_AsSsize_t(c->o[C_WINDOW]);
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

/* --- OrderedDict helpers (its C type keeps its order only through the mapping calls) */
static int odict_pop_first(PyObject *od, PyObject **key, PyObject **value)
{
    PyObject *pair = PyObject_CallMethodOneArg(od, s_popitem, Py_False);
    if (pair == NULL)
        return -1;
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        Py_DECREF(pair);
        PyErr_SetString(PyExc_TypeError, "popitem: not a pair");
        return -1;
    }
    if (key != NULL) {
        *key = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
        *value = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
    }
    Py_DECREF(pair);
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

static PyObject *pair(PyObject *a, PyObject *b) { return PyTuple_Pack(2, a, b); }
static PyObject *triple(PyObject *a, PyObject *b, PyObject *c) { return PyTuple_Pack(3, a, b, c); }

/* --- a completed rendezvous: the straggler tracker's part (straggler.py) ------------ */

/* steptime.RankSteps.get: the step `key` of a rank's steps (made when new); a new
 * reference, or NULL with an error set. */
static PyObject *step_of(PyObject *t, PyObject *key, long long k)
{
    PyObject *steps = FIELD(t, L_RANKSTEPS, RS_STEPS);
    PyObject *st = mget(steps, key);
    if (st != NULL || PyErr_Occurred())
        return st;
    PyObject *args[T_N] = {Py_None, f_zero, f_zero, i_zero, i_zero, Py_None, Py_None,
                           f_zero, Py_None, Py_None};
    st = layout_make(&L_STEP, args);
    if (st == NULL || PyObject_SetItem(steps, key, st) < 0)
        goto error;
    if (k < 0) {
        PyObject *more = PyNumber_Add(FIELD(t, L_RANKSTEPS, RS_TURNS), i_one);
        if (more == NULL)
            goto error;
        field_set(t, &L_RANKSTEPS, RS_TURNS, more);
    }
    if (PyObject_Length(steps) > KEEP && odict_pop_first(steps, NULL, NULL) < 0)
        goto error;
    return st;
error:
    Py_XDECREF(st);
    return NULL;
}

static int add_float(PyObject *o, const Layout *L, int i, double x)
{
    PyObject *v = FIELD(o, *L, i);
    double old = v != NULL && PyFloat_CheckExact(v) ? PyFloat_AS_DOUBLE(v)
                                                      : PyFloat_AsDouble(v);
    if (old == -1.0 && PyErr_Occurred())
        return -1;
    PyObject *sum = PyFloat_FromDouble(old + x);
    if (sum == NULL)
        return -1;
    field_set(o, L, i, sum);
    return 0;
}

/* d[key] = d.get(key, 0.0) + x */
static int dict_add_float(PyObject *d, PyObject *key, double x)
{
    PyObject *v = PyDict_GetItemWithError(d, key);
    double old = 0.0;
    if (v != NULL) {
        old = PyFloat_AsDouble(v);
        if (old == -1.0 && PyErr_Occurred())
            return -1;
    } else if (PyErr_Occurred()) {
        return -1;
    }
    PyObject *sum = PyFloat_FromDouble(old + x);
    if (sum == NULL)
        return -1;
    int rc = PyDict_SetItem(d, key, sum);
    Py_DECREF(sum);
    return rc;
}

/* steptime.RankSteps.collective: a finished collective's time in its step. */
static int step_collective(PyObject *t, PyObject *key, long long k, PyObject *ev,
                           double ms, long long t_enter)
{
    PyObject *st = step_of(t, key, k);
    if (st == NULL)
        return -1;
    int rc = -1;
    PyObject *group = FIELD(ev, L_EVENT, E_GROUP);
    if (add_float(st, &L_STEP, T_COLL, ms) < 0)
        goto out;
    PyObject *by_group = FIELD(st, L_STEP, T_BY_GROUP);
    if (by_group == Py_None) {
        PyObject *d = PyDict_New();
        PyObject *v = PyFloat_FromDouble(ms);
        if (d == NULL || v == NULL || PyDict_SetItem(d, group, v) < 0) {
            Py_XDECREF(d);
            Py_XDECREF(v);
            goto out;
        }
        Py_DECREF(v);
        field_set(st, &L_STEP, T_BY_GROUP, d);
    } else if (!PyDict_Check(by_group) || dict_add_float(by_group, group, ms) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "by_group: not a dict");
        goto out;
    }
    PyObject *descs = FIELD(t, L_RANKSTEPS, RS_GROUP_DESC);
    int has = PyDict_Contains(descs, group);
    if (has < 0 || (!has && PyDict_SetItem(descs, group, FIELD(ev, L_EVENT, E_DESC)) < 0))
        goto out;
    if (k < 0) {  /* a turn of the pattern: from its first op to the next turn's */
        PyObject *first = FIELD(st, L_STEP, T_FIRST_ENTER), *enter = FIELD(ev, L_EVENT,
                                                                           E_ENTER);
        int set = PyObject_Not(first);
        if (set == 0)
            set = PyObject_RichCompareBool(enter, first, Py_LT);
        if (set < 0)
            goto out;
        if (set)
            field_set(st, &L_STEP, T_FIRST_ENTER, Py_NewRef(enter));
    }
    rc = 0;
out:
    Py_DECREF(st);
    return rc;
}

/* stepstats.Steps.add */
static int steps_add(PyObject *steps, PyObject *key, double lateness)
{
    PyObject *first = FIELD(steps, L_STEPS, ST_FIRST);
    if (first == Py_None) {
        field_set(steps, &L_STEPS, ST_FIRST, Py_NewRef(key));
        return 0;
    }
    int same = PyObject_RichCompareBool(key, first, Py_EQ);
    if (same)
        return same < 0 ? -1 : 0;
    PyObject *totals = FIELD(steps, L_STEPS, ST_TOTALS);
    PyObject *old = mget(totals, key);
    if (old == NULL && PyErr_Occurred())
        return -1;
    double base = 0.0;
    if (old != NULL) {
        base = PyFloat_AsDouble(old);
        Py_DECREF(old);
        if (base == -1.0 && PyErr_Occurred())
            return -1;
    }
    PyObject *sum = PyFloat_FromDouble(base + lateness);
    if (sum == NULL)
        return -1;
    int rc = PyObject_SetItem(totals, key, sum);
    Py_DECREF(sum);
    if (rc < 0 || old != NULL)
        return rc;
    if (PyObject_Length(totals) <= STEPS + 1)
        return 0;
    PyObject *k, *ms;
    if (odict_pop_first(totals, &k, &ms) < 0)
        return -1;
    PyObject *keys = FIELD(steps, L_STEPS, ST_OLD_KEYS), *sums = FIELD(steps, L_STEPS,
                                                                        ST_OLD_SUMS);
    PyObject *r1 = PyObject_CallMethodOneArg(keys, s_append, k);
    PyObject *r2 = r1 ? PyObject_CallMethodOneArg(sums, s_append, ms) : NULL;
    Py_DECREF(k);
    Py_DECREF(ms);
    Py_XDECREF(r1);
    if (r2 == NULL)
        return -1;
    Py_DECREF(r2);
    if (PyObject_Length(keys) > LONG_STEPS - STEPS &&
        (PySequence_DelItem(keys, 0) < 0 || PySequence_DelItem(sums, 0) < 0))
        return -1;
    return 0;
}

/* waitgraph.WaitGraph.add (the new waiter's table made by the Python code). */
static int graph_add(Ctx *c, PyObject *waiter, PyObject *late, PyObject *key, double ms,
                     PyObject *via)
{
    PyObject *steps = PyDict_GetItemWithError(c->o[C_EDGES], waiter);
    if (steps == NULL)
        return -2;  /* a waiter's first edge: the Python code makes its table */
    PyObject *out = mget(steps, key);
    if (out == NULL) {
        if (PyErr_Occurred() || (out = PyDict_New()) == NULL)
            return -1;
        if (PyObject_SetItem(steps, key, out) < 0) {
            Py_DECREF(out);
            return -1;
        }
        if (PyObject_Length(steps) > c->graph_keep && odict_pop_first(steps, NULL, NULL) < 0) {
            Py_DECREF(out);
            return -1;
        }
    }
    int rc = PyDict_Check(out) ? dict_add_float(out, late, ms) : -1;
    if (rc < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "wait graph: a step's edges not a dict");
    Py_DECREF(out);
    if (rc < 0)
        return -1;
    PyObject *kinds = PyDict_GetItemWithError(c->o[C_VIA], waiter);
    if (kinds == NULL)
        return PyErr_Occurred() ? -1 : -2;
    int has = PyDict_Contains(kinds, late);
    if (has)
        return has < 0 ? -1 : 0;
    int plain = PySequence_Contains(NO_WORDS, via);
    if (plain < 0)
        return -1;
    return PyDict_SetItem(kinds, late, plain ? s_waiting : via);
}

typedef struct {
    long long w;         /* its wait: t_end - t_enter */
    Py_ssize_t order;    /* its arrival's place (the sort is stable) */
    PyObject *rank, *ev; /* borrowed from the arrivals */
} Wait;

static int by_wait(const void *a, const void *b)
{
    const Wait *x = a, *y = b;
    if (x->w != y->w)
        return x->w < y->w ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* steptime.StepTimes.place for a collective: its step key (a new reference), its time
 * counted there. */
static PyObject *place(Ctx *c, PyObject *rank, PyObject *ev, double ms, long long t_enter)
{
    PyObject *t = PyDict_GetItemWithError(c->o[C_ST_RANKS], rank);
    int bad = 0;
    long long span = as_ll(FIELD(ev, L_EVENT, E_SPAN), &bad);
    PyObject *key = NULL;
    if (t != NULL && Py_IS_TYPE(t, L_RANKSTEPS.type) && !bad) {
        if (span) {
            key = Py_NewRef(FIELD(ev, L_EVENT, E_SPAN));
        } else {
            PyObject *k = pair(rank, FIELD(ev, L_EVENT, E_INDEX));
            if (k == NULL)
                return NULL;
            key = mget(c->o[C_KEYS], k);
            if (key != NULL && PyObject_DelItem(c->o[C_KEYS], k) < 0)
                Py_CLEAR(key);
            Py_DECREF(k);
            if (key == NULL && PyErr_Occurred())
                return NULL;
        }
    }
    if (key == NULL || !PyLong_CheckExact(key)) {  /* not given by assign: the Python code's */
        Py_XDECREF(key);
        return PyObject_CallMethodObjArgs(c->o[C_STEPTIME], s_place, rank, ev, Py_False,
                                          NULL);
    }
    long long k = as_ll(key, &bad);
    if (step_collective(t, key, k, ev, ms, t_enter) < 0)
        Py_CLEAR(key);
    return key;
}

/* StragglerTracker._judge for a collective: each member's lateness, its step's sum, and
 * who waited on the last to arrive. */
static int judge(Ctx *c, PyObject *rv, Wait *waits, Py_ssize_t n)
{
    PyObject *group = FIELD(rv, L_RV, R_GROUP), *members = c->o[C_MEMBERS];
    int has = PyDict_Contains(members, group);
    if (has < 0)
        return -1;
    if (!has && PyDict_GET_SIZE(members) < MAX_GROUPS) {
        PyObject *fs = PyFrozenSet_New(FIELD(rv, L_RV, R_MEMBERS));
        if (fs == NULL || PyDict_SetItem(members, group, fs) < 0) {
            Py_XDECREF(fs);
            return -1;
        }
        Py_DECREF(fs);
    }
    if (n < 2)
        return 0;
    qsort(waits, n, sizeof *waits, by_wait);
    long long w_last = waits[0].w;
    PyObject *last = waits[0].rank;
    double gap = (double)(waits[1].w - w_last) / 1e6;
    PyObject *via = NULL;
    int rc = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rank = waits[i].rank, *ev = waits[i].ev;
        PyObject *q = PyDict_GetItemWithError(c->o[C_OBS], rank);
        if (q == NULL) {  /* its first: the tracker makes its tables */
            if (PyErr_Occurred())
                goto out;
            PyObject *r = PyObject_CallMethodOneArg(c->o[C_STRAGGLER], s_observer, rank);
            if (r == NULL)
                goto out;
            Py_DECREF(r);
            if ((q = PyDict_GetItemWithError(c->o[C_OBS], rank)) == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_KeyError, "straggler: no observations made");
                goto out;
            }
        }
        int is_last = rank == last;
        if (!is_last && (is_last = PyObject_RichCompareBool(rank, last, Py_EQ)) < 0)
            goto out;
        double lateness = is_last ? gap : (double)(w_last - waits[i].w) / 1e6;
        PyObject *lat = PyFloat_FromDouble(lateness);
        PyObject *ob = lat ? PyTuple_Pack(5, lat, is_last ? Py_True : Py_False, group,
                                          FIELD(ev, L_EVENT, E_CALLSITE), Py_False) : NULL;
        Py_XDECREF(lat);
        PyObject *r = ob ? PyObject_CallMethodOneArg(q, s_append, ob) : NULL;
        Py_XDECREF(ob);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
        int bad = 0;
        PyObject *key = place(c, rank, ev, (double)waits[i].w / 1e6,
                              as_ll(FIELD(ev, L_EVENT, E_ENTER), &bad));
        if (key == NULL)
            goto out;
        PyObject *steps = PyDict_GetItemWithError(c->o[C_SSTEPS], rank);
        if (steps == NULL || !Py_IS_TYPE(steps, L_STEPS.type) ||
            steps_add(steps, key, lateness) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "straggler: no steps of the rank");
            Py_DECREF(key);
            goto out;
        }
        if (!is_last && lateness < 0) {  /* it waited on the last to arrive */
            if (via == NULL) {
                PyObject *desc = FIELD(rv, L_RV, R_DESC);
                int words = PyObject_IsTrue(desc);
                via = words > 0 ? Py_NewRef(desc)
                                : words == 0 ? PyUnicode_FromFormat("group %S", group) : NULL;
                if (via == NULL) {
                    Py_DECREF(key);
                    goto out;
                }
            }
            int g = graph_add(c, rank, last, key, -lateness, via);
            if (g == -2) {  /* its first edge: the graph makes its tables */
                PyObject *ms = PyFloat_FromDouble(-lateness);
                PyObject *r2 = ms ? PyObject_CallMethod(c->o[C_GRAPH], "add", "OOOOO", rank,
                                                        last, key, ms, via) : NULL;
                Py_XDECREF(ms);
                g = r2 ? 0 : -1;
                Py_XDECREF(r2);
            }
            if (g < 0) {
                Py_DECREF(key);
                goto out;
            }
        }
        Py_DECREF(key);
    }
    rc = 0;
out:
    Py_XDECREF(via);
    return rc;
}

/* StragglerTracker.observe of a completed collective. */
static int observe(Ctx *c, PyObject *rv)
{
    static PyObject *s_quiet;
    if (s_quiet == NULL && (s_quiet = PyUnicode_InternFromString("_quiet_as_of")) == NULL)
        return -1;
    PyObject *arrivals = FIELD(rv, L_RV, R_ARRIVALS);
    Py_ssize_t n = PyDict_GET_SIZE(arrivals);
    int rare = PyObject_Length(c->o[C_FLAGGED]) != 0;  /* ops beside the step somewhere */
    Wait stack[16], *waits = n <= 16 ? stack : PyMem_Malloc(n * sizeof *waits);
    if (waits == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t pos = 0, k = 0, i = 0;
    PyObject *rank, *ev;
    while (!rare && PyDict_Next(arrivals, &pos, &rank, &ev)) {
        int bad = 0;
        if (!Py_IS_TYPE(ev, L_EVENT.type)) {  /* fed to ingest_one as another kind */
            rare = 1;
            break;
        }
        PyObject *seen = PyDict_GetItemWithError(c->o[C_SEEN], rank);
        long long index = as_ll(FIELD(ev, L_EVENT, E_INDEX), &bad);
        if (seen == NULL || bad || index > as_ll(seen, &bad) || bad) {
            rare = 1;  /* an op its thread rule has not seen */
            break;
        }
        PyObject *end = FIELD(ev, L_EVENT, E_END);
        if (end != Py_None) {
            long long t_end = as_ll(end, &bad), t_enter = as_ll(FIELD(ev, L_EVENT, E_ENTER),
                                                                &bad);
            if (bad || t_end < 0 || t_enter < 0 || t_end > T_MAX || t_enter > T_MAX) {
                rare = 1;
                break;
            }
            waits[k++] = (Wait){t_end - t_enter, i, rank, ev};
        }
        i++;
    }
    int rc;
    if (PyErr_Occurred())
        rc = -1;
    else if (rare || n < 2)
        rc = n < 2 && !rare ? PyObject_SetAttr(c->o[C_STRAGGLER], s_quiet, Py_None)
                            : call_part(c, c->o[C_STRAGGLER], s_observe, rv, s_straggler);
    else
        rc = PyObject_SetAttr(c->o[C_STRAGGLER], s_quiet, Py_None) < 0 ? -1
                                                                       : judge(c, rv, waits, k);
    if (waits != stack)
        PyMem_Free(waits);
    return rc;
}

/* WaitJudge._completed (waits.py): the call site's longest wait; a long one, or one a
 * hang was said on, is the Python code's. */
static int completed(Ctx *c, PyObject *rv)
{
    PyObject *arrivals = FIELD(rv, L_RV, R_ARRIVALS), *group = FIELD(rv, L_RV, R_GROUP),
             *seq = FIELD(rv, L_RV, R_SEQ), *rank, *ev, *first = NULL;
    Py_ssize_t pos = 0, i = 0;
    long long longest_ns = 0;
    int bad = 0, any = 0;
    while (i++ < 64 && PyDict_Next(arrivals, &pos, &rank, &ev)) {
        if (!Py_IS_TYPE(ev, L_EVENT.type)) {
            bad = 1;
            break;
        }
        if (first == NULL)
            first = ev;
        PyObject *end = FIELD(ev, L_EVENT, E_END);
        long long t_end = end == Py_None ? -1 : as_ll(end, &bad),
                  t_enter = as_ll(FIELD(ev, L_EVENT, E_ENTER), &bad);
        if (t_end < 0 || t_enter < 0 || t_end > T_MAX || t_enter > T_MAX)
            bad = 1;  /* in flight, or a reading the Python code takes as it is */
        long long w = bad ? 0 : t_end - t_enter;
        if (!any || w > longest_ns)
            longest_ns = w;
        any = 1;
    }
    double longest = (double)longest_ns / 1e9;
    /* (a healthy job has no findings: no key to make) */
    int any_found = PyDict_GET_SIZE(c->o[C_FOUND]) > 0;
    PyObject *hang_key = any_found ? triple(s_hang, group, seq) : NULL;
    if (any_found && hang_key == NULL)
        return -1;
    PyObject *reported = any_found ? PyDict_GetItemWithError(c->o[C_FOUND], hang_key) : NULL;
    Py_XDECREF(hang_key);
    if (reported == NULL && PyErr_Occurred())
        return -1;
    if (bad || first == NULL || reported != NULL || longest >= LONG_WAIT_MIN_S)
        return call_part(c, c->engine, s_completed, rv, s_waits);
    PyObject *cs = FIELD(first, L_EVENT, E_CALLSITE);
    PyObject *file = Py_None, *line = Py_None;
    if (cs != Py_None) {
        if (!PyDict_Check(cs))
            return call_part(c, c->engine, s_completed, rv, s_waits);
        file = PyDict_GetItemWithError(cs, s_file);
        line = file || !PyErr_Occurred() ? PyDict_GetItemWithError(cs, s_line) : NULL;
        if (PyErr_Occurred())
            return -1;
        file = file ? file : Py_None;
        line = line ? line : Py_None;
    }
    PyObject *site = PyTuple_Pack(4, group, FIELD(first, L_EVENT, E_OP), file, line);
    if (site == NULL)
        return -1;
    PyObject *site_wait = c->o[C_SITE_WAIT];
    PyObject *known = PyDict_GetItemWithError(site_wait, site);
    int rc = 0;
    double was = known ? PyFloat_AsDouble(known) : 0.0;
    if (PyErr_Occurred()) {
        rc = -1;
    } else if (longest > was && (PyDict_GET_SIZE(site_wait) < MAX_SITES || known != NULL)) {
        PyObject *v = PyFloat_FromDouble(longest);
        rc = v ? PyDict_SetItem(site_wait, site, v) : -1;
        Py_XDECREF(v);
    }
    Py_DECREF(site);
    if (rc < 0 || !any_found)
        return rc;
    PyObject *lw_key = triple(s_long_wait, group, seq);
    if (lw_key == NULL)
        return -1;
    PyObject *had = PyDict_GetItemWithError(c->o[C_FOUND], lw_key);  /* (no KeyError) */
    rc = had != NULL ? PyDict_DelItem(c->o[C_FOUND], lw_key) : PyErr_Occurred() ? -1 : 0;
    Py_DECREF(lw_key);
    return rc;
}

/* Habits.agreed: counted here; the rendezvous it learns from go to the Python code. */
static int agreed(Ctx *c, PyObject *rv)
{
    PyObject *group = FIELD(rv, L_RV, R_GROUP), *counts = c->o[C_HABITS_COUNT];
    PyObject *had = PyDict_GetItemWithError(counts, group);
    int bad = 0;
    long long n = (had ? as_ll(had, &bad) : 0) + 1;
    if (PyErr_Occurred())
        return -1;
    if (bad || n <= ALL_FIRST || n % EVERY == 0) {
        PyObject *r = PyObject_CallMethodOneArg(c->o[C_HABITS], s_agreed, rv);
        Py_XDECREF(r);
        return r ? 0 : -1;
    }
    PyObject *v = PyLong_FromLongLong(n);
    int rc = v ? PyDict_SetItem(counts, group, v) : -1;
    Py_XDECREF(v);
    return rc;
}

/* Gaps.op (hangs/waits.py): the lines sampled since the rank's last op were before this. */
static int gaps_op(Ctx *c, PyObject *rank, PyObject *index)
{
    PyObject *open = c->o[C_GAPS_OPEN];
    PyObject *lines = PyDict_GetItemWithError(open, rank);
    if (lines == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(lines);
    int rc = PyDict_DelItem(open, rank);
    int some = rc < 0 ? -1 : PyObject_IsTrue(lines);
    if (some > 0) {
        PyObject *held = PyDict_GetItemWithError(c->o[C_GAPS_BEFORE], rank);
        if (held == NULL && !PyErr_Occurred()) {
            held = PyDict_New();
            if (held && PyDict_SetItem(c->o[C_GAPS_BEFORE], rank, held) < 0)
                Py_CLEAR(held);
            Py_XDECREF(held);  /* the dict holds it */
        }
        rc = held && PyDict_Check(held) ? PyDict_SetItem(held, index, lines) : -1;
        if (rc == 0 && PyDict_GET_SIZE(held) > GAPS_KEEP) {
            PyObject *low = NULL, *k, *v;
            Py_ssize_t pos = 0;
            while (rc == 0 && PyDict_Next(held, &pos, &k, &v)) {
                int less = low == NULL ? 1 : PyObject_RichCompareBool(k, low, Py_LT);
                if (less < 0)
                    rc = -1;
                else if (less)
                    low = k;
            }
            if (rc == 0 && low != NULL) {
                Py_INCREF(low);
                rc = PyDict_DelItem(held, low);
                Py_DECREF(low);
            }
        }
        if (rc < 0 && !PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "gaps: held lines not a dict");
    } else if (some < 0) {
        rc = -1;
    }
    Py_DECREF(lines);
    return rc;
}

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

/* Where a rank's main thread was between its ops (ingest_one's "sample" path:
 * steptime.RankSteps.sample, then hangs/waits.Gaps.sample); 1 done, 0 not common (the
 * Python code's), -1 an error (said for the step times, as ingest_one says it). */
static int fast_sample(Ctx *c, PyObject *ev, PyObject **f, int *committed)
{
    if (str_is(f[E_DESC], s_undefined) || !PyLong_CheckExact(f[E_NUMEL_IN]))
        return 0;
    int bad = 0;
    long long t_enter = as_ll(f[E_ENTER], &bad), span = as_ll(f[E_SPAN], &bad);
    long long t_end = f[E_END] == Py_None ? 0 : as_ll(f[E_END], &bad);
    long long numel = as_ll(f[E_NUMEL_IN], &bad);
    if (bad || t_enter <= 0 || t_enter > T_MAX || t_end < 0 || t_end > T_MAX || span < 0)
        return 0;
    PyObject *rank = f[E_RANK], *cs = f[E_CALLSITE];
    PyObject *st = PyDict_GetItemWithError(c->o[C_RANKS], rank);
    PyObject *t = st ? PyDict_GetItemWithError(c->o[C_ST_RANKS], rank) : NULL;
    if (st == NULL || t == NULL || !Py_IS_TYPE(st, L_RANK.type) ||
        !Py_IS_TYPE(t, L_RANKSTEPS.type))
        return PyErr_Occurred() ? -1 : 0;
    long long max_t = as_ll(FIELD(st, L_RANK, S_MAX_T), &bad);
    long long last_ns = as_ll(FIELD(t, L_RANKSTEPS, RS_LAST_SAMPLE), &bad);
    PyObject *period = FIELD(t, L_RANKSTEPS, RS_PERIOD);
    if (bad || !max_t || last_ns < 0 || last_ns > T_MAX || period == NULL ||
        (period != Py_None && !PyFloat_CheckExact(period)))
        return 0;
    int has_site = cs != Py_None && PyDict_Check(cs) && PyDict_GET_SIZE(cs) > 0;
    PyObject *function = Py_None, *file = Py_None, *line = Py_None;
    if (cs != Py_None && !PyDict_Check(cs))
        return 0;
    if (has_site) {
        if ((function = site_get(cs, s_function)) == NULL || (file = site_get(cs, s_file)) ==
            NULL || (line = site_get(cs, s_line)) == NULL)
            return -1;
        /* a comprehension's or lambda's name stands for the function around it
         * (steptime._enclosing): the Python code's */
        if (PyUnicode_Check(function) && PyUnicode_GET_LENGTH(function) &&
            PyUnicode_READ_CHAR(function, PyUnicode_GET_LENGTH(function) - 1) == '>') {
            Py_ssize_t at = PyUnicode_Find(function, s_locals, 0,
                                           PyUnicode_GET_LENGTH(function), 1);
            if (at != -1)  /* (-2: an error, set) */
                return at == -2 ? -1 : 0;
        }
    }
    PyObject *open_lines = has_site ? PyDict_GetItemWithError(c->o[C_GAPS_OPEN], rank) : NULL;
    if (open_lines != NULL && !Py_IS_TYPE(open_lines, (PyTypeObject *)COUNTER))
        return 0;
    if (PyErr_Occurred())
        return -1;

    *committed = 1;
    long long t_now = t_end ? t_end : t_enter;
    if (t_now > max_t)
        field_set(st, &L_RANK, S_MAX_T, Py_NewRef(t_end ? f[E_END] : f[E_ENTER]));
    int rc = -1;
    PyObject *site = NULL, *gsite = NULL, *runq = PyFloat_FromDouble(
        numel > 0 ? (double)numel / 1000 : 0.0);
    if (runq == NULL)
        goto out;
    if (has_site) {  /* RankSteps.sample: the line, in its step or loose */
        site = PyTuple_Pack(3, function, file, line);
        if (site == NULL)
            goto out;
        if (span) {
            PyObject *step = step_of(t, f[E_SPAN], span);
            if (step == NULL)
                goto out;
            PyObject *samples = FIELD(step, L_STEP, T_SAMPLES);
            if (samples == Py_None) {
                samples = PyObject_CallNoArgs(COUNTER);
                if (samples != NULL)
                    field_set(step, &L_STEP, T_SAMPLES, samples);
            }
            int ok = samples != NULL && PyDict_Check(samples) && count_one(samples, site) == 0
                     && add_float(step, &L_STEP, T_RUNQ, PyFloat_AS_DOUBLE(runq)) == 0;
            Py_DECREF(step);
            if (!ok)
                goto out;
        } else {
            PyObject *item = PyTuple_Pack(3, f[E_ENTER], site, runq);
            PyObject *r = item ? PyObject_CallMethodOneArg(FIELD(t, L_RANKSTEPS, RS_LOOSE),
                                                           s_append, item) : NULL;
            Py_XDECREF(item);
            if (r == NULL)
                goto out;
            Py_DECREF(r);
        }
    }
    if (last_ns) {  /* the sampler's period: the shortest gap between two samples */
        double gap = (double)(t_enter - last_ns) / 1e6;
        double below = period == Py_None || PyFloat_AS_DOUBLE(period) == 0.0
                           ? 1000 : PyFloat_AS_DOUBLE(period);
        if (0 < gap && gap < below) {
            PyObject *g = PyFloat_FromDouble(gap);
            if (g == NULL)
                goto out;
            field_set(t, &L_RANKSTEPS, RS_PERIOD, g);
        }
    }
    field_set(t, &L_RANKSTEPS, RS_LAST_SAMPLE, Py_NewRef(f[E_ENTER]));
    if (has_site) {  /* Gaps.sample: the lines since the rank's newest op */
        gsite = PyTuple_Pack(3, file, line, function);
        if (gsite == NULL)
            goto out;
        if (open_lines == NULL) {
            PyObject *fresh = PyObject_CallNoArgs(COUNTER);
            if (fresh == NULL || PyDict_SetItem(c->o[C_GAPS_OPEN], rank, fresh) < 0) {
                Py_XDECREF(fresh);
                goto out;
            }
            open_lines = fresh;
            Py_DECREF(fresh);  /* (the dict holds it) */
        }
        int in = PyDict_Contains(open_lines, gsite);
        if (in < 0 || ((in || PyDict_GET_SIZE(open_lines) < GAPS_SITES) &&
                       count_one(open_lines, gsite) < 0))
            goto out;
        PyObject *was = PyDict_GetItemWithError(c->o[C_GAPS_LAST], rank);
        int moved = was ? PyObject_RichCompareBool(was, gsite, Py_NE) : !PyErr_Occurred();
        if (moved < 0 || PyErr_Occurred())
            goto out;
        if (moved && (PyDict_SetItem(c->o[C_GAPS_LAST], rank, gsite) < 0 ||
                      PyDict_SetItem(c->o[C_GAPS_MOVED], rank, f[E_ENTER]) < 0))
            goto out;
        if (PyDict_SetItem(c->o[C_GAPS_SEEN], rank, f[E_ENTER]) < 0)
            goto out;
    }
    rc = 1;
out:
    Py_XDECREF(runq);
    Py_XDECREF(site);
    Py_XDECREF(gsite);
    if (rc < 0 && failed(c, s_step_times) == 0)  /* said as ingest_one says it */
        rc = 1;
    return rc;
}

/* A rank's repeating pattern of collectives, found (steptime.Pattern), as assign reads it. */
typedef struct {
    PyObject *pattern;  /* borrowed */
    long long period, count, start, turns0;
} Turn;

/* Whether a new op's step is the common path's to give (the rank's main thread the only
 * one on the group and its step thread; a span, or a pattern found): 1, with the pattern
 * read; 0 the Python code's; -1 an error. */
static int turn_of(Ctx *c, PyObject *rank, PyObject *group, long long span, Turn *turn)
{
    PyObject *user = pair(rank, group);
    if (user == NULL)
        return -1;
    int main_only = is_zero(c->o[C_USERS], user) && is_zero(c->o[C_OF], rank);
    Py_DECREF(user);
    PyObject *t = PyDict_GetItemWithError(c->o[C_ST_RANKS], rank);
    if (!main_only || t == NULL || !Py_IS_TYPE(t, L_RANKSTEPS.type) ||
        !Py_IS_TYPE(FIELD(t, L_RANKSTEPS, RS_PATTERN), L_PATTERN.type))
        return PyErr_Occurred() ? -1 : 0;
    PyObject *pattern = turn->pattern = FIELD(t, L_RANKSTEPS, RS_PATTERN);
    if (span)
        return 1;
    int bad = 0;
    turn->period = as_ll(FIELD(pattern, L_PATTERN, P_PERIOD), &bad);
    turn->count = as_ll(FIELD(pattern, L_PATTERN, P_COUNT), &bad);
    turn->start = as_ll(FIELD(pattern, L_PATTERN, P_START), &bad);
    turn->turns0 = as_ll(FIELD(pattern, L_PATTERN, P_TURNS0), &bad);
    return !(bad || turn->period <= 0 || turn->count < 0 || turn->count > T_MAX ||
             turn->turns0 < 0 || turn->turns0 > T_MAX || turn->start < 0);
}

/* A finished op's place among the rank's done ones (its newest, and the tally of its
 * group and op: [ops completed, seconds inside them]). */
static int tally_done(PyObject *st, PyObject *ev, PyObject **f, PyObject *last_done,
                      long long t_end, long long t_enter)
{
    int newer = last_done == Py_None ? 1 : PyObject_RichCompareBool(
        f[E_INDEX], FIELD(last_done, L_EVENT, E_INDEX), Py_GE);
    if (newer < 0)
        return -1;
    if (newer)
        field_set(st, &L_RANK, S_LAST_DONE, Py_NewRef(ev));
    PyObject *tkey = triple(f[E_GROUP], f[E_DESC], f[E_OP]);
    if (tkey == NULL)
        return -1;
    PyObject *completed_ = FIELD(st, L_RANK, S_COMPLETED);
    PyObject *tally = PyDict_GetItemWithError(completed_, tkey);
    if (tally == NULL && !PyErr_Occurred()) {
        tally = Py_BuildValue("[id]", 0, 0.0);
        if (tally && PyDict_SetItem(completed_, tkey, tally) < 0)
            Py_CLEAR(tally);
        Py_XDECREF(tally);  /* the dict holds it */
    }
    Py_DECREF(tkey);
    if (tally == NULL || !PyList_CheckExact(tally) || PyList_GET_SIZE(tally) != 2) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "engine: a rank's tally of an unexpected shape");
        return -1;
    }
    PyObject *n1 = PyNumber_Add(PyList_GET_ITEM(tally, 0), i_one);
    if (n1 == NULL)
        return -1;
    PyList_SetItem(tally, 0, n1);
    double secs = PyFloat_AsDouble(PyList_GET_ITEM(tally, 1));
    PyObject *s1 = PyErr_Occurred() ? NULL
                                    : PyFloat_FromDouble(secs + (double)(t_end - t_enter) / 1e9);
    if (s1 == NULL)
        return -1;
    PyList_SetItem(tally, 1, s1);
    return 0;
}

/* steptime.StepTimes.assign of a new main-thread op: seen in its rank's order; a
 * span-less op's turn of its rank's pattern (found already: `period`...). */
static int assign(Ctx *c, PyObject *rank, PyObject **f, long long span, const Turn *tn)
{
    if (PyDict_SetItem(c->o[C_ASSIGNED], rank, f[E_INDEX]) < 0 ||
        PyDict_SetItem(c->o[C_SEEN], rank, f[E_INDEX]) < 0)
        return -1;
    if (span)
        return 0;
    long long count = tn->count + 1;
    PyObject *cnt = PyLong_FromLongLong(count);
    PyObject *turn = PyLong_FromLongLong(-PATTERN_BASE - tn->turns0 -
                                         floor_div(count - tn->start, tn->period));
    PyObject *pk = pair(rank, f[E_INDEX]);
    int ok = cnt && turn && pk && PyObject_SetItem(c->o[C_KEYS], pk, turn) == 0 &&
             PyDict_SetItem(c->o[C_TURN], rank, turn) == 0;
    if (ok)
        field_set(tn->pattern, &L_PATTERN, P_COUNT, Py_NewRef(cnt));
    Py_XDECREF(cnt);
    Py_XDECREF(turn);
    Py_XDECREF(pk);
    if (!ok || (PyObject_Length(c->o[C_KEYS]) > MAX_KEYS &&
                odict_pop_first(c->o[C_KEYS], NULL, NULL) < 0))
        return -1;
    return 0;
}

/* Whether a collective takes the common path (finished; or read in flight, and then its
 * end), and if so its ingest: 1 done, 0 not common (nothing changed: ingest_one's), -1 an
 * error (part of it done: *committed). A sample goes to fast_sample. */
static int fast_event(Ctx *c, PyObject *ev, PyObject *now, int *committed)
{
    PyObject *f[E_N];
    for (int i = 0; i < E_N; i++)
        if ((f[i] = FIELD(ev, L_EVENT, i)) == NULL)
            return 0;
    if (str_is(f[E_KIND], s_sample))
        return fast_sample(c, ev, f, committed);
    /* finished, or in flight (an op read before it ended: a GPU's, a long one) */
    int in_flight = f[E_END] == Py_None;
    if (!str_is(f[E_KIND], s_collective) ||
        !str_is(f[E_STATUS], in_flight ? s_in_flight : s_ok) ||
        str_is(f[E_DESC], s_undefined) ||
        !PyUnicode_CheckExact(f[E_GROUP]) || !PyUnicode_CheckExact(f[E_DESC]) ||
        !PyUnicode_CheckExact(f[E_OP]) || !PyTuple_CheckExact(f[E_GROUP_RANKS]))
        return 0;
    int bad = 0;
    long long index = as_ll(f[E_INDEX], &bad), seq = as_ll(f[E_SEQ], &bad),
              t_enter = as_ll(f[E_ENTER], &bad),
              t_end = in_flight ? 0 : as_ll(f[E_END], &bad), span = as_ll(f[E_SPAN], &bad);
    as_ll(f[E_RANK], &bad);
    if (bad || seq < 0 || seq == LLONG_MAX || t_enter < 0 || t_end < 0 || t_enter > T_MAX ||
        t_end > T_MAX)
        return 0;
    PyObject *rank = f[E_RANK], *group = f[E_GROUP];
    /* a group a user thread took turns on is followed by threads.py's ThreadUse */
    if (PyDict_GET_SIZE(c->o[C_THREAD_LAST])) {
        PyObject *user = pair(rank, group);
        int followed = user ? PyDict_Contains(c->o[C_THREAD_LAST], user) : -1;
        Py_XDECREF(user);
        if (followed)
            return followed < 0 ? -1 : 0;
    }
    /* the rank: seen before; this op newer than its newest, or the end of one seen in
     * flight (an update: the rest of its ingest was done then) */
    PyObject *st = PyDict_GetItemWithError(c->o[C_RANKS], rank);
    if (st == NULL || !Py_IS_TYPE(st, L_RANK.type))
        return PyErr_Occurred() ? -1 : 0;
    PyObject *latest = FIELD(st, L_RANK, S_LATEST), *last_done = FIELD(st, L_RANK,
                                                                       S_LAST_DONE);
    long long max_t = as_ll(FIELD(st, L_RANK, S_MAX_T), &bad);
    if (bad || !max_t || latest == NULL || !Py_IS_TYPE(latest, L_EVENT.type) ||
        last_done == NULL || (last_done != Py_None && !Py_IS_TYPE(last_done, L_EVENT.type)))
        return 0;
    long long latest_index = as_ll(FIELD(latest, L_EVENT, E_INDEX), &bad);
    int update = index <= latest_index;
    if (bad || (update && in_flight))  /* (an op read in flight again) */
        return 0;
    /* the main thread's (threads.py thread_of, beside.py) */
    PyObject *cs = f[E_CALLSITE];
    if (cs != Py_None) {
        if (!PyDict_Check(cs))
            return 0;
        PyObject *tid = PyDict_GetItemWithError(cs, s_thread_id);
        if (tid != NULL ? (as_ll(tid, &bad) != 0 || bad) : PyErr_Occurred() != NULL)
            return PyErr_Occurred() ? -1 : 0;
    }
    /* its step (steptime.py assign): its span's, or a turn of a pattern already found;
     * an update's was given when it was seen in flight */
    PyObject *assigned = PyDict_GetItemWithError(c->o[C_ASSIGNED], rank);
    long long given = assigned != NULL ? as_ll(assigned, &bad) : -1;
    if (bad || (update ? assigned == NULL || index > given : index <= given))
        return PyErr_Occurred() ? -1 : 0;
    Turn turn = {NULL, 0, 0, 0, 0};
    if (!update) {
        int common = turn_of(c, rank, group, span, &turn);
        if (common <= 0)
            return common;
    }
    /* one name, one member list for the group on this rank (group_order.py) */
    PyObject *names = FIELD(st, L_RANK, S_NAMES);
    PyObject *name = names && PyDict_CheckExact(names) ? PyDict_GetItemWithError(names, group)
                                                       : NULL;
    if (name == NULL || !PyTuple_CheckExact(name) || PyTuple_GET_SIZE(name) != 2)
        return PyErr_Occurred() ? -1 : 0;
    if (PyTuple_GET_ITEM(name, 0) != f[E_GROUP_RANKS]) {
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(name, 0), f[E_GROUP_RANKS], Py_EQ);
        if (same <= 0)
            return same;
    }
    int variant = PyObject_IsTrue(PyTuple_GET_ITEM(name, 1));
    if (variant)
        return variant < 0 ? -1 : 0;
    /* its rendezvous: new, or open with this rank not in it and every arrival agreeing;
     * an update's: open, with the op in flight in it */
    PyObject *key = triple(s_c, group, f[E_SEQ]);
    PyObject *raw = key ? PyTuple_Pack(6, f[E_OP], f[E_NUMEL_IN], f[E_NUMEL_OUT],
                                       f[E_DTYPES], f[E_REDOP], f[E_PEER]) : NULL;
    PyObject *rv = raw ? Py_XNewRef(PyDict_GetItemWithError(c->o[C_OPEN], key)) : NULL;
    int rc = 0;
    if (raw == NULL || PyErr_Occurred()) {
        rc = -1;
        goto out;
    }
    if (rv != NULL) {
        if (!Py_IS_TYPE(rv, L_RV.type))
            goto out;
        PyObject *arrivals = FIELD(rv, L_RV, R_ARRIVALS), *first_raw;
        PyObject *members = FIELD(rv, L_RV, R_MEMBERS);
        if (arrivals == NULL || !PyDict_CheckExact(arrivals) || members == NULL ||
            !PyTuple_CheckExact(members) || FIELD(rv, L_RV, R_MISMATCH) != Py_None ||
            FIELD(rv, L_RV, R_DONE) == NULL)
            goto out;
        PyObject *old = PyDict_GetItemWithError(arrivals, rank);
        if (update ? old == NULL || !Py_IS_TYPE(old, L_EVENT.type) ||
                         FIELD(old, L_EVENT, E_END) != Py_None
                   : old != NULL) {
            rc = PyErr_Occurred() ? -1 : 0;
            goto out;
        }
        first_raw = FIELD(rv, L_RV, R_FIRST_RAW);
        if (first_raw == NULL)
            goto out;
        if (first_raw != Py_None && !update) {  /* (an update keeps its signature) */
            int same = PyObject_RichCompareBool(raw, first_raw, Py_EQ);
            if (same <= 0) {
                rc = same < 0 ? -1 : 0;
                goto out;
            }
        }
    } else if (update || PyDict_GET_SIZE(c->o[C_OPEN]) >= MAX_OPEN) {
        goto out;
    } else {  /* its members: ranks (the decoder's are; an odd list is the Python code's) */
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(f[E_GROUP_RANKS]); i++)
            if (!PyLong_CheckExact(PyTuple_GET_ITEM(f[E_GROUP_RANKS], i)))
                goto out;
    }

    /* --- ingest_one's collective path, from here on changing state ------------------ */
    *committed = 1;
    rc = -1;
    if ((in_flight ? t_enter : t_end) > max_t)
        field_set(st, &L_RANK, S_MAX_T, Py_NewRef(in_flight ? f[E_ENTER] : f[E_END]));
    /* its activity, kept from a rank's first p2p op on (waitgraph.Activity) */
    if (PyDict_GET_SIZE(c->o[C_TIMES]) &&
        call_part(c, c->o[C_STRAGGLER], s_op, ev, s_straggler) < 0)
        goto out;
    if (!update) {  /* its newest op */
        PyObject *r = PyObject_CallMethodOneArg(FIELD(st, L_RANK, S_RECENT), s_append, ev);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
        if (gaps_op(c, rank, f[E_INDEX]) < 0)
            goto out;
    }
    if (index >= latest_index)  /* (an update of an older one leaves the newest) */
        field_set(st, &L_RANK, S_LATEST, Py_NewRef(ev));
    if (!in_flight && tally_done(st, ev, f, last_done, t_end, t_enter) < 0)
        goto out;
    if (!update && assign(c, rank, f, span, &turn) < 0)
        goto out;
    /* the group's ops issued */
    PyObject *issued = FIELD(st, L_RANK, S_ISSUED);
    PyObject *had = PyDict_GetItemWithError(issued, group);
    int behind = had ? PyObject_RichCompareBool(had, f[E_SEQ], Py_LE) : !PyErr_Occurred();
    if (behind < 0 || PyErr_Occurred())
        goto out;
    if (behind) {
        PyObject *next = PyLong_FromLongLong(seq + 1);
        int ok = next && PyDict_SetItem(issued, group, next) == 0;
        Py_XDECREF(next);
        if (!ok)
            goto out;
    }
    /* the rendezvous: opened (rendezvous.Rendezvous.open), and this rank's arrival */
    if (rv == NULL) {
        PyObject *arrivals = PyDict_New();
        if (arrivals == NULL)
            goto out;
        PyObject *args[R_N] = {key, group, f[E_DESC], f[E_SEQ], f[E_GROUP_RANKS], now,
                               arrivals, i_zero, Py_None, Py_None, Py_None, Py_False};
        rv = layout_make(&L_RV, args);
        Py_DECREF(arrivals);
        if (rv == NULL || PyDict_SetItem(c->o[C_OPEN], key, rv) < 0)
            goto out;
    }
    PyObject *arrivals = FIELD(rv, L_RV, R_ARRIVALS);
    PyObject *done = PyNumber_Add(FIELD(rv, L_RV, R_DONE), in_flight ? i_zero : i_one);
    if (done == NULL || PyDict_SetItem(arrivals, rank, ev) < 0) {
        Py_XDECREF(done);
        goto out;
    }
    field_set(rv, &L_RV, R_DONE, done);
    if (!update && FIELD(rv, L_RV, R_FIRST_RAW) == Py_None)
        field_set(rv, &L_RV, R_FIRST_RAW, Py_NewRef(raw));
    /* complete: every member arrived and finished (Rendezvous.complete) */
    PyObject *members = FIELD(rv, L_RV, R_MEMBERS);
    Py_ssize_t m = PyTuple_GET_SIZE(members), n_done = PyLong_AsSsize_t(done);
    int complete = m > 0 && n_done >= m && n_done >= PyDict_GET_SIZE(arrivals) &&
                   PyDict_GET_SIZE(arrivals) >= m;
    for (Py_ssize_t i = 0; complete && i < m; i++) {
        int in = PyDict_Contains(arrivals, PyTuple_GET_ITEM(members, i));
        if (in < 0)
            goto out;
        complete = in;
    }
    rc = 1;
    if (complete) {
        if (PyDict_DelItem(c->o[C_OPEN], key) < 0)
            rc = -1;
        else {
            if (observe(c, rv) < 0 && failed(c, s_straggler) < 0)
                rc = -1;
            if (rc == 1 && c->waits_on && completed(c, rv) < 0 && failed(c, s_waits) < 0)
                rc = -1;
            if (rc == 1 && agreed(c, rv) < 0)
                rc = -1;
        }
    }
out:
    Py_XDECREF(rv);
    Py_XDECREF(key);
    Py_XDECREF(raw);
    return rc;
}

static PyObject *ingest(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "ingest(engine, events: list, now_s)");
        return NULL;
    }
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "ingest: configure() first");
        return NULL;
    }
    PyObject *events = args[1];
    Ctx c = {args[0], args[2]};
    int usable = ctx_load(&c) == 0;
    PyErr_Clear();  /* an engine without one of the parts: every event is ingest_one's */
    Py_ssize_t here = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        Py_INCREF(ev);
        int committed = 0;
        int rc = usable && Py_IS_TYPE(ev, L_EVENT.type) ? fast_event(&c, ev, c.now, &committed)
                                                        : 0;
        if (rc < 0 && !committed) {  /* an odd value met before anything changed: the */
            PyErr_Clear();           /* Python code takes it, and says what it makes of it */
            rc = 0;
        }
        if (rc == 0) {
            PyObject *r = PyObject_CallMethodObjArgs(c.engine, s_ingest_one, ev, c.now, NULL);
            Py_XDECREF(r);
            rc = r != NULL ? 0 : -1;
        }
        here += committed;  /* (ingest_one counts an event before it can fail, as here) */
        Py_DECREF(ev);
        if (rc < 0 && failed(&c, s_ingest) < 0)
            goto error;
        /* The Python code ran: the parts are the same objects (made once, in their
         * owners' __init__), but a failure may have switched the waits judge off. */
        if (rc <= 0 && usable) {
            int off = PySet_Contains(c.o[C_OFF], s_waits);
            usable = off >= 0;
            c.waits_on = !off;
            PyErr_Clear();
        }
    }
    ctx_clear(&c);
    /* ingest_one counts its own; the engine's count of those taken here */
    PyObject *count = PyObject_GetAttrString(args[0], "ingested");
    PyObject *more = count ? PyNumber_Add(count, PyLong_FromSsize_t(here)) : NULL;
    Py_XDECREF(count);
    if (more == NULL || PyObject_SetAttrString(args[0], "ingested", more) < 0) {
        Py_XDECREF(more);
        return NULL;
    }
    Py_DECREF(more);
    return PyLong_FromSsize_t(here);
error:
    ctx_clear(&c);
    return NULL;
}

/* One setting of configure's dict: an int (or a float for the wait, an object). */
static int setting(PyObject *d, const char *name, Py_ssize_t *out)
{
    PyObject *v = PyDict_GetItemString(d, name);
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "configure: %s missing", name);
        return -1;
    }
    *out = PyLong_AsSsize_t(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *configure(PyObject *mod, PyObject *d)
{
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "configure(settings: dict)");
        return NULL;
    }
    Py_ssize_t base;
    if (setting(d, "MAX_OPEN", &MAX_OPEN) || setting(d, "KEEP", &KEEP) ||
        setting(d, "STEPS", &STEPS) || setting(d, "LONG_STEPS", &LONG_STEPS) ||
        setting(d, "MAX_KEYS", &MAX_KEYS) || setting(d, "MAX_GROUPS", &MAX_GROUPS) ||
        setting(d, "MAX_SITES", &MAX_SITES) || setting(d, "GAPS_KEEP", &GAPS_KEEP) ||
        setting(d, "ALL_FIRST", &ALL_FIRST) || setting(d, "EVERY", &EVERY) ||
        setting(d, "GAPS_SITES", &GAPS_SITES) ||
        setting(d, "PATTERN_BASE", &base))
        return NULL;
    PATTERN_BASE = base;
    PyObject *wait = PyDict_GetItemString(d, "LONG_WAIT_MIN_S");
    LONG_WAIT_MIN_S = wait ? PyFloat_AsDouble(wait) : -1.0;
    PyObject *no_words = PyDict_GetItemString(d, "NO_WORDS");
    if (PyErr_Occurred() || no_words == NULL || EVERY <= 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "configure: LONG_WAIT_MIN_S, NO_WORDS, EVERY");
        return NULL;
    }
    Py_XSETREF(NO_WORDS, Py_NewRef(no_words));
    PyObject *counter = PyDict_GetItemString(d, "Counter");
    if (counter == NULL || !PyType_Check(counter)) {
        PyErr_SetString(PyExc_TypeError, "configure: Counter");
        return NULL;
    }
    Py_XSETREF(COUNTER, Py_NewRef(counter));
    struct { Layout *L; const char *name; } classes[] = {
        {&L_EVENT, "Event"}, {&L_RV, "Rendezvous"}, {&L_RANK, "RankState"},
        {&L_STEP, "StepTime"}, {&L_STEPS, "Steps"}, {&L_RANKSTEPS, "RankSteps"},
        {&L_PATTERN, "Pattern"}};
    for (size_t i = 0; i < sizeof classes / sizeof *classes; i++) {
        PyObject *type = PyDict_GetItemString(d, classes[i].name);
        if (type == NULL || !PyType_Check(type) ||
            !layout_learn(classes[i].L, (PyTypeObject *)type)) {
            PyErr_Format(PyExc_TypeError, "configure: %s's fields are not plain slots",
                         classes[i].name);
            return NULL;
        }
    }
    if (!L_RV.creatable || !L_STEP.creatable) {
        PyErr_SetString(PyExc_TypeError, "configure: Rendezvous, StepTime not creatable");
        return NULL;
    }
    configured = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"ingest", (PyCFunction)(void (*)(void))ingest, METH_FASTCALL,
     "ingest(engine, events, now_s) -> the events taken on the common path"},
    {"configure", configure, METH_O, "configure(settings): the engine's classes and limits"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ingest",
                                    "The diagnosis engine's common ingest in C.", -1, methods};

PyMODINIT_FUNC PyInit__ingest(void)
{
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_collective, "collective"); INTERN(s_ok, "ok");
    INTERN(s_in_flight, "in_flight"); INTERN(s_undefined, "undefined");
    INTERN(s_c, "c"); INTERN(s_hang, "hang"); INTERN(s_long_wait, "long_wait");
    INTERN(s_thread_id, "thread_id"); INTERN(s_file, "file"); INTERN(s_line, "line");
    INTERN(s_waiting, "waiting"); INTERN(s_waits, "waits"); INTERN(s_straggler, "straggler");
    INTERN(s_ingest, "event ingest"); INTERN(s_append, "append"); INTERN(s_popitem, "popitem");
    INTERN(s_ingest_one, "ingest_one"); INTERN(s_failed, "_feed_failed");
    INTERN(s_observe, "observe"); INTERN(s_completed, "_completed"); INTERN(s_agreed, "agreed");
    INTERN(s_observer, "_observer"); INTERN(s_place, "place"); INTERN(s_op, "op");
    INTERN(s_sample, "sample"); INTERN(s_function, "function");
    INTERN(s_locals, ".<locals>.<");
    INTERN(s_step_times, "step times");
#undef INTERN
    if ((f_zero = PyFloat_FromDouble(0.0)) == NULL || (i_zero = PyLong_FromLong(0)) == NULL ||
        (i_one = PyLong_FromLong(1)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
