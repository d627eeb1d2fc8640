/* The engine's C ingest (_ingest.c): a rendezvous completed on the common path, as
 * Engine.ingest_one completes one: the straggler tracker's part (each member's lateness,
 * its step's sums, its place in the step accounting, who waited on whom), the waits
 * judge's (the call site's longest wait), the habits' count; and Gaps.op (the lines
 * sampled before an op). Rare cases call the Python code that owns them. */
#ifndef DISTDOCTOR_INGEST_COMPLETION_H
#define DISTDOCTOR_INGEST_COMPLETION_H

#include "ingest_base.h"

/* --- a completed rendezvous: the straggler tracker's part (straggler.py) ------------ */

/* A step record past KEEP, held by nothing but its table, is made the new step's (as
 * new: every field a fresh StepTime's) rather than freed: a loop of one collective per
 * iteration makes and drops one per collective, and most of that cost was the dropped
 * record's cold memory freed and new memory taken. Its by_group table, emptied, is kept
 * for the next step that needs one. */
static PyObject *spare_by_group;

static PyObject *reuse_step(PyObject *old, PyObject *const *fresh)
{
    if (!Py_IS_TYPE(old, L_STEP.type) || !L_STEP.creatable || Py_REFCNT(old) != 1) {
        Py_DECREF(old);
        return NULL;
    }
    PyObject *by_group = FIELD(old, L_STEP, T_BY_GROUP);
    if (spare_by_group == NULL && by_group != NULL && PyDict_CheckExact(by_group) &&
        Py_REFCNT(by_group) == 1) {
        spare_by_group = Py_NewRef(by_group);
        PyDict_Clear(spare_by_group);
    }
    for (int i = 0; i < L_STEP.n; i++)
        field_set(old, &L_STEP, i, Py_NewRef(fresh[i]));
    return old;
}

/* steptime.RankSteps.get: the step `key` of a rank's steps (made when new); a new
 * reference, or NULL with an error set. The oldest step goes first when the table is
 * full (RankSteps.get adds, then drops the oldest past KEEP: the same table). */
static PyObject *step_of(PyObject *t, PyObject *key, long long k)
{
    PyObject *steps = FIELD(t, L_RANKSTEPS, RS_STEPS);
    PyObject *st = mget(steps, key);
    if (st != NULL || PyErr_Occurred())
        return st;
    PyObject *args[T_N] = {Py_None, f_zero, f_zero, i_zero, i_zero, Py_None, Py_None,
                           f_zero, Py_None, Py_None};
    Py_ssize_t n = PyObject_Length(steps);
    if (n < 0)
        return NULL;
    if (n >= KEEP) {
        PyObject *old_key, *old;
        if (pop_oldest(steps, 1, &old_key, &old) < 0)
            return NULL;
        Py_DECREF(old_key);
        st = reuse_step(old, args);
    }
    if (st == NULL && (st = layout_make(&L_STEP, args)) == NULL)
        return NULL;
    if (PyObject_SetItem(steps, key, st) < 0)
        goto error;
    if (k < 0) {
        PyObject *more = PyNumber_Add(FIELD(t, L_RANKSTEPS, RS_TURNS), i_one);
        if (more == NULL)
            goto error;
        field_set(t, &L_RANKSTEPS, RS_TURNS, more);
    }
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

/* m[key] = m.get(key, 0.0) + x, for a dict or an OrderedDict (written through its own
 * method, which keeps its order): 1 when the key is new, 0 when it was there, -1 an error. */
static int map_add_float(PyObject *m, PyObject *key, double x)
{
    if (!PyDict_Check(m)) {
        PyErr_SetString(PyExc_TypeError, "engine: a table that is not a dict");
        return -1;
    }
    PyObject *v = PyDict_GetItemWithError(m, key);
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
    int rc = PyDict_CheckExact(m) ? PyDict_SetItem(m, key, sum) : PyObject_SetItem(m, key, sum);
    Py_DECREF(sum);
    return rc < 0 ? -1 : v == NULL;
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
        PyObject *d = spare_by_group ? spare_by_group : PyDict_New();
        spare_by_group = NULL;
        PyObject *v = PyFloat_FromDouble(ms);
        if (d == NULL || v == NULL || PyDict_SetItem(d, group, v) < 0) {
            Py_XDECREF(d);
            Py_XDECREF(v);
            goto out;
        }
        Py_DECREF(v);
        field_set(st, &L_STEP, T_BY_GROUP, d);
    } else if (map_add_float(by_group, group, ms) < 0) {
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

/* array.frombytes(the values' bytes): one call for a window's worth (an array of
 * "q" or "d" holds 8-byte machine values) */
static int extend_array(PyObject *array, const void *values, Py_ssize_t n)
{
    PyObject *bytes = PyBytes_FromStringAndSize(values, n * 8);
    PyObject *r = bytes ? PyObject_CallMethodOneArg(array, s_frombytes, bytes) : NULL;
    Py_XDECREF(bytes);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* stepstats.Steps._close_oldest: the window's `n` oldest steps into the arrays. */
static int close_oldest(PyObject *steps, PyObject *totals, Py_ssize_t n)
{
    long long *keys = PyMem_Malloc(n * sizeof *keys);
    double *sums = PyMem_Malloc(n * sizeof *sums);
    int rc = -1;
    if (keys == NULL || sums == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k, *ms;
        if (pop_oldest(totals, 1, &k, &ms) < 0)
            goto out;
        int bad = 0;
        keys[i] = as_ll(k, &bad);
        sums[i] = PyFloat_AsDouble(ms);
        Py_DECREF(k);
        Py_DECREF(ms);
        if (bad) {
            PyErr_SetString(PyExc_OverflowError, "a step key past 64 bits");
            goto out;
        }
        if (sums[i] == -1.0 && PyErr_Occurred())
            goto out;
    }
    PyObject *old_keys = FIELD(steps, L_STEPS, ST_OLD_KEYS), *old_sums = FIELD(
        steps, L_STEPS, ST_OLD_SUMS);
    if (extend_array(old_keys, keys, n) < 0 || extend_array(old_sums, sums, n) < 0)
        goto out;
    Py_ssize_t had = PyObject_Length(old_keys), keep = LONG_STEPS - STEPS;  /* OLD_STEPS */
    if (had < 0 || (had > 2 * keep && (PySequence_DelSlice(old_keys, 0, had - keep) < 0 ||
                                       PySequence_DelSlice(old_sums, 0, had - keep) < 0)))
        goto out;
    rc = 0;
out:
    PyMem_Free(keys);
    PyMem_Free(sums);
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
    int added = map_add_float(totals, key, lateness);
    if (added <= 0)
        return added;
    Py_ssize_t n = PyObject_Length(totals);
    return n < 0 ? -1 : n > 2 * STEPS + 1 ? close_oldest(steps, totals, n - STEPS - 1) : 0;
}

/* waitgraph.WaitGraph.add (the new waiter's table made by the Python code). */
static int graph_add(Ctx *c, PyObject *waiter, PyObject *late, PyObject *key, double ms,
                     PyObject *via)
{
    PyObject *steps = PyDict_GetItemWithError(c->o[C_EDGES], waiter);
    if (steps == NULL)  /* a waiter's first edge: the Python code makes its tables */
        return PyErr_Occurred() ? -1 : -2;
    PyObject *out = mget(steps, key);
    if (out == NULL) {
        if (PyErr_Occurred() || (out = PyDict_New()) == NULL)
            return -1;
        if (PyObject_SetItem(steps, key, out) < 0) {
            Py_DECREF(out);
            return -1;
        }
        if (PyObject_Length(steps) > c->graph_keep && pop_oldest(steps, 1, NULL, NULL) < 0) {
            Py_DECREF(out);
            return -1;
        }
    }
    int rc = map_add_float(out, late, ms);
    Py_DECREF(out);
    if (rc < 0)
        return -1;
    /* how it waited (its table made with its edges' by WaitGraph.add: one missing is
     * made here, the edge being counted already) */
    PyObject *kinds = PyDict_GetItemWithError(c->o[C_VIA], waiter);
    if (kinds == NULL) {
        if (PyErr_Occurred() || (kinds = PyDict_New()) == NULL)
            return -1;
        rc = PyDict_SetItem(c->o[C_VIA], waiter, kinds);
        Py_DECREF(kinds);  /* (the dict holds it) */
        if (rc < 0)
            return -1;
    }
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
        int appended = ob ? append_to(q, ob) : -1;
        Py_XDECREF(ob);
        if (appended < 0)
            goto out;
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

#endif
