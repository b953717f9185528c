/* The value of an exact int (the caller checked PyLong_CheckExact) that CPython keeps
 * in at most two digits (one from 3.12 on): read in place, without the call to
 * PyLong_AsLongLongAndOverflow that costs more than the rest of a column loop or a
 * packed run. 0 when the int is larger: the caller then makes that call. Every int
 * that fits in two digits fits in 64 bits. Shared by `_columns.c` and `_durable.c`;
 * include after <Python.h>. */
#ifndef BASTION_COMPACT_LONG_H
#define BASTION_COMPACT_LONG_H

static inline int
compact_long(PyObject *o, long long *v)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (_PyLong_IsCompact((PyLongObject *)o)) {
        *v = (long long)_PyLong_CompactValue((PyLongObject *)o);
        return 1;
    }
    return 0;
#else
    const digit *d = ((PyLongObject *)o)->ob_digit;
    switch (Py_SIZE(o)) {
    case 0: *v = 0; return 1;
    case 1: *v = (long long)d[0]; return 1;
    case -1: *v = -(long long)d[0]; return 1;
    case 2: *v = (long long)d[0] | ((long long)d[1] << PyLong_SHIFT); return 1;
    case -2: *v = -((long long)d[0] | ((long long)d[1] << PyLong_SHIFT)); return 1;
    default: return 0;
    }
#endif
}

#endif
