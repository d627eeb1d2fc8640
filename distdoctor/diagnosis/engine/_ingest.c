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
#include "ingest_base.h"        /* classes, settings, the engine's parts, helpers */
#include "ingest_completion.h"  /* a completed rendezvous: stragglers, waits, habits */

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
    /* (numel_in / 1000 is exact in a double up to 2^53, as Python's int division is) */
    if (bad || t_enter <= 0 || t_enter > T_MAX || t_end < 0 || t_end > T_MAX || span < 0 ||
        numel > (1LL << 53))
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
    if (cs != Py_None && !PyDict_Check(cs))
        return 0;
    int has_site = cs != Py_None && PyDict_GET_SIZE(cs) > 0;  /* (`if ev.callsite:`) */
    PyObject *function = Py_None, *file = Py_None, *line = Py_None;
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
            int appended = item ? append_to(FIELD(t, L_RANKSTEPS, RS_LOOSE), item) : -1;
            Py_XDECREF(item);
            if (appended < 0)
                goto out;
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
                pop_oldest(c->o[C_KEYS], 0, NULL, NULL) < 0))
        return -1;
    return 0;
}

/* Rendezvous.first_raw: what its arrivals must agree on (engine.core: a cheap equality
 * test), made for the first arrival only. */
static PyObject *raw_of(PyObject **f)
{
    return PyTuple_Pack(6, f[E_OP], f[E_NUMEL_IN], f[E_NUMEL_OUT], f[E_DTYPES], f[E_REDOP],
                        f[E_PEER]);
}

/* raw_of(f) == first: field by field, without making the tuple (a later arrival's is
 * never kept); 1, 0, or -1 with an error set. */
static int same_raw(PyObject *first, PyObject **f)
{
    if (!PyTuple_CheckExact(first) || PyTuple_GET_SIZE(first) != 6) {
        PyObject *raw = raw_of(f);
        int same = raw ? PyObject_RichCompareBool(raw, first, Py_EQ) : -1;
        Py_XDECREF(raw);
        return same;
    }
    static const int fields[6] = {E_OP, E_NUMEL_IN, E_NUMEL_OUT, E_DTYPES, E_REDOP, E_PEER};
    for (int i = 0; i < 6; i++) {
        int same = PyObject_RichCompareBool(f[fields[i]], PyTuple_GET_ITEM(first, i), Py_EQ);
        if (same <= 0)
            return same;
    }
    return 1;
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
    PyObject *key = triple(s_c, group, f[E_SEQ]), *raw = NULL;
    PyObject *rv = key ? Py_XNewRef(PyDict_GetItemWithError(c->o[C_OPEN], key)) : NULL;
    int rc = 0;
    if (key == NULL || PyErr_Occurred()) {
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
            int same = same_raw(first_raw, f);
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
        if (append_to(FIELD(st, L_RANK, S_RECENT), ev) < 0)
            goto out;
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
    if (!update && FIELD(rv, L_RV, R_FIRST_RAW) == Py_None) {
        if ((raw = raw_of(f)) == NULL)
            goto out;
        field_set(rv, &L_RV, R_FIRST_RAW, Py_NewRef(raw));
    }
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

/* _drop_oldest(table) -> (key, value): a per-step table's oldest dropped as the ingest
 * drops it (pop_oldest, with the remembered place), for the tests. */
static PyObject *drop_oldest(PyObject *mod, PyObject *table)
{
    PyObject *k, *v;
    if (pop_oldest(table, 1, &k, &v) < 0)
        return NULL;
    PyObject *kv = PyTuple_Pack(2, k, v);
    Py_DECREF(k);
    Py_DECREF(v);
    return kv;
}

static PyMethodDef methods[] = {
    {"_drop_oldest", drop_oldest, METH_O, "_drop_oldest(table) -> its oldest (key, value)"},
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
    INTERN(s_frombytes, "frombytes");
    INTERN(s_ingest_one, "ingest_one"); INTERN(s_failed, "_feed_failed");
    INTERN(s_observe, "observe"); INTERN(s_completed, "_completed"); INTERN(s_agreed, "agreed");
    INTERN(s_observer, "_observer"); INTERN(s_place, "place"); INTERN(s_op, "op");
    INTERN(s_sample, "sample"); INTERN(s_function, "function");
    INTERN(s_locals, ".<locals>.<"); INTERN(s_quiet, "_quiet_as_of");
    INTERN(s_step_times, "step times");
#undef INTERN
    if ((f_zero = PyFloat_FromDouble(0.0)) == NULL || (i_zero = PyLong_FromLong(0)) == NULL ||
        (i_one = PyLong_FromLong(1)) == NULL)
        return NULL;
    PyObject *collections = PyImport_ImportModule("collections");
    DEQUE = collections ? PyObject_GetAttrString(collections, "deque") : NULL;
    DEQUE_APPEND = DEQUE ? PyObject_GetAttrString(DEQUE, "append") : NULL;
    Py_XDECREF(collections);
    if (DEQUE_APPEND == NULL || !PyType_Check(DEQUE))
        return NULL;
    return PyModule_Create(&module);
}
