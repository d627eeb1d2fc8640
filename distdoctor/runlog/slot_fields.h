/* Fields of a Python class read and written by offset, for the C hot paths (the slot
 * decoder, runlog/_decode.c; the engine's ingest, diagnosis/engine/_ingest.c).
 *
 * A class qualifies when each named field is a plain member slot (an object pointer, not
 * read-only: what `__slots__` and `@dataclass(slots=True)` make). Then a field is one load,
 * where an attribute look-up walks the type's dictionaries; and, for `creatable` classes
 * whose slots are exactly these fields, an instance is allocated and its fields stored
 * without its generated __init__ (a plain dataclass: no __post_init__ to honour).
 */
#ifndef DISTDOCTOR_SLOT_FIELDS_H
#define DISTDOCTOR_SLOT_FIELDS_H

#include <Python.h>
#include <structmember.h>

#define LAYOUT_MAX 32

typedef struct {
    const char *const *names;
    int n;
    PyTypeObject *type;  /* strong reference: the class learnt */
    Py_ssize_t off[LAYOUT_MAX];
    int ok;              /* every field a plain member slot */
    int creatable;       /* ... and instances can be made by filling them */
} Layout;

/* Learn `type`'s offsets (again only when it is another class); 1 when usable. */
static int layout_learn(Layout *L, PyTypeObject *type)
{
    if (L->type == type)
        return L->ok;
    Py_XDECREF(L->type);
    Py_INCREF(type);
    L->type = type;
    L->ok = L->creatable = 0;
    if (L->n > LAYOUT_MAX)
        return 0;
    for (int i = 0; i < L->n; i++) {
        /* a member slot read from its class is its descriptor */
        PyObject *d = PyObject_GetAttrString((PyObject *)type, L->names[i]);
        if (d == NULL) {
            PyErr_Clear();
            return 0;
        }
        int plain = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                    ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
                    !(((PyMemberDescrObject *)d)->d_member->flags & READONLY);
        if (plain)
            L->off[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!plain)
            return 0;
    }
    L->ok = 1;
    PyObject *slots = PyObject_GetAttrString((PyObject *)type, "__slots__");
    Py_ssize_t n_slots = slots != NULL ? PyObject_Length(slots) : -1;
    Py_XDECREF(slots);
    PyErr_Clear();
    L->creatable = n_slots == L->n && type->tp_new == PyBaseObject_Type.tp_new &&
                   type->tp_alloc == PyType_GenericAlloc &&
                   !PyObject_HasAttrString((PyObject *)type, "__post_init__");
    return 1;
}

/* A field (borrowed; NULL when unset). */
#define FIELD(o, L, i) (*(PyObject **)((char *)(o) + (L).off[i]))

/* Store a new reference into a field (stolen), dropping the old value. */
static inline void field_set(PyObject *o, const Layout *L, int i, PyObject *v)
{
    PyObject **p = (PyObject **)((char *)o + L->off[i]);
    PyObject *old = *p;
    *p = v;
    Py_XDECREF(old);
}

/* An instance of a creatable layout's class from borrowed `args` (one per field); a new
 * reference, or NULL with an error set. */
static PyObject *layout_make(const Layout *L, PyObject *const *args)
{
    if (!L->creatable)
        return PyObject_Vectorcall((PyObject *)L->type, args, L->n, NULL);
    PyObject *o = L->type->tp_alloc(L->type, 0);
    if (o == NULL)
        return NULL;
    for (int i = 0; i < L->n; i++) {
        Py_INCREF(args[i]);
        FIELD(o, *L, i) = args[i];
    }
    return o;
}

#endif
