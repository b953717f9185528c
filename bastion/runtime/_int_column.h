/* IntColumn and PairColumn: columns of a batch held as machine words.
 *
 * An IntColumn is an immutable sequence of exact Python ints that fit in 64 bits,
 * stored as int64s: what a numpy batch function returns, a packed column off the wire,
 * a piece of a cut one. To Python it is a sequence like a tuple of those ints (len,
 * indexing, slicing, iteration, == with a list or tuple of equal ints), making an int
 * only when one is asked for; to numpy it is a read-only int64 buffer. The kernels of
 * `_columns.c` read its words directly, so a column of numbers that never meets a
 * per-record Python function is never made into Python objects at all.
 *
 * A PairColumn is the sequence of pairs (firsts[i], seconds[i]) of two IntColumns of
 * one length: the running output (key, result) of a built-in aggregation folded over
 * IntColumns (`fold_int_column`), each pair made as a tuple when asked for.
 *
 * Included by `_columns.c` only (after <Python.h> and <stdint.h>). */
#ifndef BASTION_INT_COLUMN_H
#define BASTION_INT_COLUMN_H

#include <stddef.h>

typedef struct {
    PyObject_VAR_HEAD          /* ob_size: the number of items */
    int64_t items[1];
} IntColumn;

static PyTypeObject IntColumnType;
static PyTypeObject PairColumnType;

#define IntColumn_Check(o) (Py_TYPE(o) == &IntColumnType)
#define IntColumn_SIZE(o) Py_SIZE(o)
#define IntColumn_ITEMS(o) (((IntColumn *)(o))->items)

/* A new IntColumn of n items, uninitialised. */
static PyObject *
int_column_new(Py_ssize_t n)
{
    IntColumn *c = PyObject_NewVar(IntColumn, &IntColumnType, n);
    return (PyObject *)c;
}

static PyObject *
int_column_item(PyObject *self, Py_ssize_t i)
{
    if (i < 0 || i >= Py_SIZE(self)) {
        PyErr_SetString(PyExc_IndexError, "IntColumn index out of range");
        return NULL;
    }
    return PyLong_FromLongLong(IntColumn_ITEMS(self)[i]);
}

static Py_ssize_t
int_column_length(PyObject *self)
{
    return Py_SIZE(self);
}

static PyObject *
int_column_subscript(PyObject *self, PyObject *index)
{
    if (PyIndex_Check(index)) {
        Py_ssize_t i = PyNumber_AsSsize_t(index, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred())
            return NULL;
        if (i < 0)
            i += Py_SIZE(self);
        return int_column_item(self, i);
    }
    if (PySlice_Check(index)) {
        Py_ssize_t start, stop, step;
        if (PySlice_Unpack(index, &start, &stop, &step) < 0)
            return NULL;
        Py_ssize_t n = PySlice_AdjustIndices(Py_SIZE(self), &start, &stop, step);
        PyObject *out = int_column_new(n);
        if (out == NULL)
            return NULL;
        const int64_t *from = IntColumn_ITEMS(self);
        int64_t *to = IntColumn_ITEMS(out);
        if (step == 1)
            memcpy(to, from + start, (size_t)n * sizeof(int64_t));
        else
            for (Py_ssize_t k = 0; k < n; k++)
                to[k] = from[start + k * step];
        return out;
    }
    PyErr_Format(PyExc_TypeError, "IntColumn indices must be integers or slices, not %.200s",
                 Py_TYPE(index)->tp_name);
    return NULL;
}

static PyObject *
int_column_tolist(PyObject *self, PyObject *unused)
{
    Py_ssize_t n = Py_SIZE(self);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyLong_FromLongLong(IntColumn_ITEMS(self)[i]);
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

/* `mine` (a new list of a column's items, consumed) == or != the items of `other`
 * (a list, a tuple or a column): as two lists of those items compare. */
static PyObject *
compare_items(PyObject *mine, PyObject *other, int op)
{
    if (mine == NULL)
        return NULL;
    PyObject *theirs = PySequence_List(other);
    if (theirs == NULL) {
        Py_DECREF(mine);
        return NULL;
    }
    int equal = PyObject_RichCompareBool(mine, theirs, Py_EQ);
    Py_DECREF(mine);
    Py_DECREF(theirs);
    if (equal < 0)
        return NULL;
    return PyBool_FromLong((op == Py_EQ) == (equal != 0));
}

/* Equal to another IntColumn of the same words, or to a list or tuple of equal items
 * (as a tuple compares with a tuple); any other order than == and != is not defined. */
static PyObject *
int_column_richcompare(PyObject *self, PyObject *other, int op)
{
    if (op != Py_EQ && op != Py_NE)
        Py_RETURN_NOTIMPLEMENTED;
    if (IntColumn_Check(other)) {
        int equal = Py_SIZE(self) == Py_SIZE(other)
                    && memcmp(IntColumn_ITEMS(self), IntColumn_ITEMS(other),
                              (size_t)Py_SIZE(self) * sizeof(int64_t)) == 0;
        return PyBool_FromLong((op == Py_EQ) == equal);
    }
    if (PyList_Check(other) || PyTuple_Check(other))
        return compare_items(int_column_tolist(self, NULL), other, op);
    Py_RETURN_NOTIMPLEMENTED;
}

static PyObject *
int_column_repr(PyObject *self)
{
    PyObject *items = int_column_tolist(self, NULL);
    if (items == NULL)
        return NULL;
    PyObject *out = PyUnicode_FromFormat("IntColumn(%R)", items);
    Py_DECREF(items);
    return out;
}

static const Py_ssize_t INT64_STRIDE = sizeof(int64_t);

/* A read-only view of the words: numpy.frombuffer(column, dtype=numpy.int64). */
static int
int_column_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    if (flags & PyBUF_WRITABLE) {
        PyErr_SetString(PyExc_BufferError, "an IntColumn is immutable");
        view->obj = NULL;
        return -1;
    }
    view->buf = IntColumn_ITEMS(self);
    view->obj = self;
    Py_INCREF(self);
    view->len = Py_SIZE(self) * (Py_ssize_t)sizeof(int64_t);
    view->readonly = 1;
    view->itemsize = sizeof(int64_t);
    view->format = (flags & PyBUF_FORMAT) ? "q" : NULL;
    view->ndim = 1;
    view->shape = (flags & PyBUF_ND) ? &((PyVarObject *)self)->ob_size : NULL;
    view->strides = (flags & PyBUF_STRIDES) ? (Py_ssize_t *)&INT64_STRIDE : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static PyObject *int_column_from(PyObject *module, PyObject *source);

static PyObject *
int_column_reduce(PyObject *self, PyObject *unused)
{
    PyObject *items = int_column_tolist(self, NULL);
    if (items == NULL)
        return NULL;
    PyObject *module = PyImport_ImportModule("bastion.runtime._columns");
    if (module == NULL) {
        Py_DECREF(items);
        return NULL;
    }
    PyObject *make = PyObject_GetAttrString(module, "int_column");
    Py_DECREF(module);
    if (make == NULL) {
        Py_DECREF(items);
        return NULL;
    }
    return Py_BuildValue("(N(N))", make, items);
}

/* Iteration: the words as ints, one at a time (what a per-record function sees). */
typedef struct {
    PyObject_HEAD
    PyObject *column;  /* NULL once exhausted */
    Py_ssize_t next;
} IntColumnIter;

static PyTypeObject IntColumnIterType;

static PyObject *
int_column_iter(PyObject *self)
{
    IntColumnIter *it = PyObject_New(IntColumnIter, &IntColumnIterType);
    if (it == NULL)
        return NULL;
    Py_INCREF(self);
    it->column = self;
    it->next = 0;
    return (PyObject *)it;
}

static PyObject *
int_column_iter_next(PyObject *self)
{
    IntColumnIter *it = (IntColumnIter *)self;
    if (it->column == NULL)
        return NULL;
    if (it->next < Py_SIZE(it->column))
        return PyLong_FromLongLong(IntColumn_ITEMS(it->column)[it->next++]);
    Py_CLEAR(it->column);
    return NULL;
}

static void
int_column_iter_dealloc(PyObject *self)
{
    Py_XDECREF(((IntColumnIter *)self)->column);
    PyObject_Free(self);
}

static PyTypeObject IntColumnIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bastion.runtime._columns.IntColumnIterator",
    .tp_basicsize = sizeof(IntColumnIter),
    .tp_dealloc = int_column_iter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = int_column_iter_next,
};

static PySequenceMethods int_column_as_sequence = {
    .sq_length = int_column_length,
    .sq_item = int_column_item,
};

static PyMappingMethods int_column_as_mapping = {
    .mp_length = int_column_length,
    .mp_subscript = int_column_subscript,
};

static PyBufferProcs int_column_as_buffer = {
    .bf_getbuffer = int_column_getbuffer,
};

static PyMethodDef int_column_methods[] = {
    {"tolist", int_column_tolist, METH_NOARGS, "the items as a list of ints"},
    {"__reduce__", int_column_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject IntColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bastion.runtime._columns.IntColumn",
    .tp_basicsize = offsetof(IntColumn, items),
    .tp_itemsize = sizeof(int64_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_SEQUENCE,
    .tp_doc = "An immutable column of ints held as int64 words (see bastion.runtime.columns).",
    .tp_repr = int_column_repr,
    .tp_as_sequence = &int_column_as_sequence,
    .tp_as_mapping = &int_column_as_mapping,
    .tp_as_buffer = &int_column_as_buffer,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_richcompare = int_column_richcompare,
    .tp_iter = int_column_iter,
    .tp_methods = int_column_methods,
};

/* The words of `source` as a new IntColumn, or None (no error) when it is not a column
 * of ints that fit in 64 bits: an IntColumn (itself), a 1-D buffer of signed or
 * unsigned integers (a numpy array; an unsigned word beyond 2**63-1 gives None), or a
 * list or tuple of exact ints (not bools). A buffer of another item type (floats,
 * bools) gives None, and so do bytes, bytearrays and memoryviews. */
static PyObject *
int_column_from(PyObject *module, PyObject *source)
{
    if (IntColumn_Check(source)) {
        Py_INCREF(source);
        return source;
    }
    if (PyList_CheckExact(source) || PyTuple_CheckExact(source)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(source);
        PyObject *out = int_column_new(n);
        if (out == NULL)
            return NULL;
        PyObject **items = PySequence_Fast_ITEMS(source);
        for (Py_ssize_t i = 0; i < n; i++) {
            long long v;
            int overflow = 0;
            if (!PyLong_CheckExact(items[i])) {
                Py_DECREF(out);
                Py_RETURN_NONE;
            }
            if (!compact_long(items[i], &v))
                v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
            if (overflow) {
                Py_DECREF(out);
                Py_RETURN_NONE;
            }
            IntColumn_ITEMS(out)[i] = v;
        }
        return out;
    }
    /* bytes are bytes, not a column of small numbers */
    if (!PyObject_CheckBuffer(source) || PyBytes_Check(source) || PyByteArray_Check(source)
            || PyMemoryView_Check(source))
        Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(source, &view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();  /* not a simple strided buffer: not a column we take */
        Py_RETURN_NONE;
    }
    PyObject *out = Py_None;
    Py_INCREF(out);
    const char *format = view.format == NULL ? "B" : view.format;
    char kind = format[0];
    if (kind == '<' || kind == '=' || kind == '@' || kind == '!' || kind == '>') {
        /* numpy writes '<' for little-endian: the host's order on every host we build
         * on; another order is not taken */
        int native = kind != '!' && kind != '>';
        if (!native)
            goto done;
        kind = format[1];
        if (kind == '\0' || format[2] != '\0')
            goto done;
    } else if (format[1] != '\0')
        goto done;
    int is_signed;
    switch (kind) {
    case 'b': case 'h': case 'i': case 'l': case 'q': is_signed = 1; break;
    case 'B': case 'H': case 'I': case 'L': case 'Q': is_signed = 0; break;
    default: goto done;
    }
    if (view.format == NULL || view.ndim != 1
            || !(view.itemsize == 1 || view.itemsize == 2 || view.itemsize == 4
                 || view.itemsize == 8))
        goto done;
    Py_ssize_t n = view.shape[0];
    Py_ssize_t stride = view.strides == NULL ? view.itemsize : view.strides[0];
    PyObject *column = int_column_new(n);
    if (column == NULL) {
        Py_CLEAR(out);
        goto done;
    }
    int64_t *to = IntColumn_ITEMS(column);
    const char *from = (const char *)view.buf;
    for (Py_ssize_t i = 0; i < n; i++, from += stride) {
        int64_t v;
        switch (view.itemsize) {
        case 1: v = is_signed ? (int64_t)*(const int8_t *)from : (int64_t)*(const uint8_t *)from; break;
        case 2: { int16_t s; uint16_t u; memcpy(&s, from, 2); memcpy(&u, from, 2);
                  v = is_signed ? (int64_t)s : (int64_t)u; break; }
        case 4: { int32_t s; uint32_t u; memcpy(&s, from, 4); memcpy(&u, from, 4);
                  v = is_signed ? (int64_t)s : (int64_t)u; break; }
        default: {
            uint64_t u;
            memcpy(&u, from, 8);
            if (!is_signed && u > (uint64_t)INT64_MAX) {
                Py_DECREF(column);
                goto done;
            }
            memcpy(&v, &u, 8);
        }
        }
        to[i] = v;
    }
    Py_SETREF(out, column);
done:
    PyBuffer_Release(&view);
    return out;
}

/* -- PairColumn -------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *firsts;   /* IntColumns of one length */
    PyObject *seconds;
} PairColumn;

#define PairColumn_Check(o) (Py_TYPE(o) == &PairColumnType)

static PyObject *
pair_column_make(PyObject *firsts, PyObject *seconds)
{
    if (!IntColumn_Check(firsts) || !IntColumn_Check(seconds)) {
        PyErr_SetString(PyExc_TypeError, "a PairColumn pairs two IntColumns");
        return NULL;
    }
    if (Py_SIZE(firsts) != Py_SIZE(seconds)) {
        PyErr_Format(PyExc_ValueError, "a PairColumn pairs columns of one length, "
                     "not %zd and %zd", Py_SIZE(firsts), Py_SIZE(seconds));
        return NULL;
    }
    PairColumn *c = PyObject_New(PairColumn, &PairColumnType);
    if (c == NULL)
        return NULL;
    Py_INCREF(firsts);
    Py_INCREF(seconds);
    c->firsts = firsts;
    c->seconds = seconds;
    return (PyObject *)c;
}

static PyObject *
pair_column_from(PyObject *module, PyObject *args)
{
    PyObject *firsts, *seconds;
    if (!PyArg_ParseTuple(args, "OO:pair_column", &firsts, &seconds))
        return NULL;
    return pair_column_make(firsts, seconds);
}

static void
pair_column_dealloc(PyObject *self)
{
    Py_DECREF(((PairColumn *)self)->firsts);
    Py_DECREF(((PairColumn *)self)->seconds);
    PyObject_Free(self);
}

static Py_ssize_t
pair_column_length(PyObject *self)
{
    return Py_SIZE(((PairColumn *)self)->firsts);
}

static PyObject *
pair_column_item(PyObject *self, Py_ssize_t i)
{
    PairColumn *c = (PairColumn *)self;
    if (i < 0 || i >= Py_SIZE(c->firsts)) {
        PyErr_SetString(PyExc_IndexError, "PairColumn index out of range");
        return NULL;
    }
    PyObject *first = PyLong_FromLongLong(IntColumn_ITEMS(c->firsts)[i]);
    if (first == NULL)
        return NULL;
    PyObject *second = PyLong_FromLongLong(IntColumn_ITEMS(c->seconds)[i]);
    if (second == NULL) {
        Py_DECREF(first);
        return NULL;
    }
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        Py_DECREF(first);
        Py_DECREF(second);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, first);
    PyTuple_SET_ITEM(pair, 1, second);
    return pair;
}

static PyObject *
pair_column_tolist(PyObject *self, PyObject *unused)
{
    Py_ssize_t n = pair_column_length(self);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = pair_column_item(self, i);
        if (pair == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, pair);
    }
    return out;
}

static PyObject *
pair_column_subscript(PyObject *self, PyObject *index)
{
    PairColumn *c = (PairColumn *)self;
    if (PySlice_Check(index)) {
        PyObject *firsts = int_column_subscript(c->firsts, index);
        if (firsts == NULL)
            return NULL;
        PyObject *seconds = int_column_subscript(c->seconds, index);
        if (seconds == NULL) {
            Py_DECREF(firsts);
            return NULL;
        }
        PyObject *out = pair_column_make(firsts, seconds);
        Py_DECREF(firsts);
        Py_DECREF(seconds);
        return out;
    }
    if (PyIndex_Check(index)) {
        Py_ssize_t i = PyNumber_AsSsize_t(index, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred())
            return NULL;
        if (i < 0)
            i += pair_column_length(self);
        return pair_column_item(self, i);
    }
    PyErr_Format(PyExc_TypeError, "PairColumn indices must be integers or slices, not %.200s",
                 Py_TYPE(index)->tp_name);
    return NULL;
}

static PyObject *
pair_column_richcompare(PyObject *self, PyObject *other, int op)
{
    if (op != Py_EQ && op != Py_NE)
        Py_RETURN_NOTIMPLEMENTED;
    if (!PairColumn_Check(other) && !PyList_Check(other) && !PyTuple_Check(other))
        Py_RETURN_NOTIMPLEMENTED;
    return compare_items(pair_column_tolist(self, NULL), other, op);
}

static PyObject *
pair_column_repr(PyObject *self)
{
    PyObject *items = pair_column_tolist(self, NULL);
    if (items == NULL)
        return NULL;
    PyObject *out = PyUnicode_FromFormat("PairColumn(%R)", items);
    Py_DECREF(items);
    return out;
}

static PyObject *
pair_column_reduce(PyObject *self, PyObject *unused)
{
    PyObject *module = PyImport_ImportModule("bastion.runtime._columns");
    if (module == NULL)
        return NULL;
    PyObject *make = PyObject_GetAttrString(module, "pair_column");
    Py_DECREF(module);
    if (make == NULL)
        return NULL;
    return Py_BuildValue("(N(OO))", make, ((PairColumn *)self)->firsts,
                         ((PairColumn *)self)->seconds);
}

static PyObject *
pair_column_firsts(PyObject *self, void *unused)
{
    Py_INCREF(((PairColumn *)self)->firsts);
    return ((PairColumn *)self)->firsts;
}

static PyObject *
pair_column_seconds(PyObject *self, void *unused)
{
    Py_INCREF(((PairColumn *)self)->seconds);
    return ((PairColumn *)self)->seconds;
}

static PySequenceMethods pair_column_as_sequence = {
    .sq_length = pair_column_length,
    .sq_item = pair_column_item,
};

static PyMappingMethods pair_column_as_mapping = {
    .mp_length = pair_column_length,
    .mp_subscript = pair_column_subscript,
};

static PyMethodDef pair_column_methods[] = {
    {"tolist", pair_column_tolist, METH_NOARGS, "the pairs as a list of tuples"},
    {"__reduce__", pair_column_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef pair_column_getset[] = {
    {"firsts", pair_column_firsts, NULL, "the IntColumn of every pair's first item", NULL},
    {"seconds", pair_column_seconds, NULL, "the IntColumn of every pair's second item", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PairColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bastion.runtime._columns.PairColumn",
    .tp_basicsize = sizeof(PairColumn),
    .tp_dealloc = pair_column_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_SEQUENCE,
    .tp_doc = "The pairs (firsts[i], seconds[i]) of two IntColumns "
              "(see bastion.runtime.columns).",
    .tp_repr = pair_column_repr,
    .tp_as_sequence = &pair_column_as_sequence,
    .tp_as_mapping = &pair_column_as_mapping,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_richcompare = pair_column_richcompare,
    .tp_methods = pair_column_methods,
    .tp_getset = pair_column_getset,
};

#endif
