/* Column kernels of the keyed exchange and of logged window results: the per-record
 * loops of routing, of the frame codec and of the log form, in C.
 * `bastion.runtime.columns` documents what each one computes and holds the
 * pure-Python equivalents, used where this module was not built and by the tests
 * that check the two agree. Everything here works on one column of a
 * batch at a time and never calls user code, except the key comparisons of the
 * partition lookup (a user key's __hash__ / __eq__). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_compact_long.h"
#include <stdint.h>
#include "_int_column.h"
#include <stdint.h>
#include <string.h>
#include <limits.h>

#define MAX_DESTINATIONS 256

/* partitions(memo, keys[, table]) -> bytes: memo[key] (an int 0..255) for every key.
 * A key missing from memo raises KeyError (the caller hashes it and tries again).
 * ``table``, a bytearray, caches the codes of the int keys 0..len(table)-1: byte k is
 * key k's code, or 255 while unknown. Most keyed streams key by small ints, and
 * indexing a byte costs a fraction of a dict lookup (hash, probe, compare). A key's
 * code never changes while the number of destinations stays, so the table is never
 * invalidated, even when the caller clears memo. */
/* The code of `key` (held by the caller) from memo, stored in table[cached] when
 * cached is a slot of it; -1 on an error (KeyError when memo has no such key). */
static int
memo_code(PyObject *memo, PyObject *key, PyObject *table, long long cached)
{
    PyObject *part = PyDict_GetItemWithError(memo, key); /* borrowed */
    if (part == NULL) {
        if (!PyErr_Occurred()) {
            PyObject *wrapped = PyTuple_Pack(1, key);
            if (wrapped != NULL) {
                PyErr_SetObject(PyExc_KeyError, wrapped);
                Py_DECREF(wrapped);
            }
        }
        return -1;
    }
    long long small;
    long p = PyLong_CheckExact(part) && compact_long(part, &small)
             ? (long)small : PyLong_AsLong(part);
    if (p < 0 || p >= MAX_DESTINATIONS) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "partition %ld is outside 0..255", p);
        return -1;
    }
    /* 255 is the table's "unknown": that destination's keys take the dict. The
     * bounds are checked again: ``cached`` may hold a key outside the table, and
     * the lookup may have run a colliding key's __eq__. */
    if (cached >= 0 && p != 0xFF && table != NULL && cached < PyByteArray_GET_SIZE(table))
        PyByteArray_AS_STRING(table)[cached] = (char)p;
    return (int)p;
}

/* partitions of an IntColumn of keys: the table by the word itself, the memo with
 * the key made an int only for a word outside it */
static PyObject *
int_partitions(PyObject *memo, PyObject *keys, PyObject *table)
{
    Py_ssize_t n = Py_SIZE(keys);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL)
        return NULL;
    unsigned char *codes = (unsigned char *)PyBytes_AS_STRING(out);
    const int64_t *words = IntColumn_ITEMS(keys);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = words[i];
        if (table != NULL && v >= 0 && v < PyByteArray_GET_SIZE(table)) {
            unsigned char code = (unsigned char)PyByteArray_AS_STRING(table)[v];
            if (code != 0xFF) {
                codes[i] = code;
                continue;
            }
        }
        PyObject *key = PyLong_FromLongLong(v);
        if (key == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        int code = memo_code(memo, key, table, v >= 0 ? v : -1);
        Py_DECREF(key);
        if (code < 0) {
            Py_DECREF(out);
            return NULL;
        }
        codes[i] = (unsigned char)code;
    }
    return out;
}

static PyObject *
partitions(PyObject *module, PyObject *args)
{
    PyObject *memo, *keys, *table = NULL;
    if (!PyArg_ParseTuple(args, "O!O|O!:partitions", &PyDict_Type, &memo, &keys,
                          &PyByteArray_Type, &table))
        return NULL;
    if (IntColumn_Check(keys))
        return int_partitions(memo, keys, table);
    PyObject *seq = PySequence_Fast(keys, "keys must be a list or a tuple");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *codes = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        /* a key's __eq__ is user code: hold the key, and re-read the size, so that
         * nothing it does can leave us reading freed memory */
        if (i >= PySequence_Fast_GET_SIZE(seq)) {
            PyErr_SetString(PyExc_RuntimeError, "keys changed size during routing");
            goto fail;
        }
        PyObject *key = PySequence_Fast_GET_ITEM(seq, i);
        long long cached = -1;  /* the key's slot in table, when in 0..len(table)-1 */
        if (table != NULL && PyLong_CheckExact(key) && compact_long(key, &cached)
                && cached >= 0 && cached < PyByteArray_GET_SIZE(table)) {
            unsigned char code = (unsigned char)PyByteArray_AS_STRING(table)[cached];
            if (code != 0xFF) {
                codes[i] = code;
                continue;
            }
        }
        Py_INCREF(key);
        int code = memo_code(memo, key, table, cached);
        Py_DECREF(key);
        if (code < 0)
            goto fail;
        codes[i] = (unsigned char)code;
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

/* An exact float, or an exact int that fits in 64 bits: a value that a msgpack round
 * trip gives back equal and of the same type, and that nobody can mutate. */
static inline int
is_exact_number(PyObject *item)
{
    if (PyFloat_CheckExact(item))
        return 1;
    if (PyLong_CheckExact(item)) {
        long long v;
        int overflow = 0;
        if (!compact_long(item, &v))
            (void)PyLong_AsLongLongAndOverflow(item, &overflow);
        return !overflow;
    }
    return 0;
}

static int
check_destinations(Py_ssize_t n)
{
    if (n < 1 || n > MAX_DESTINATIONS) {
        PyErr_Format(PyExc_ValueError, "destinations must be 1..256, got %zd", n);
        return -1;
    }
    return 0;
}

/* counts[p] = how many codes are p; -1 (and ValueError) when a code is not below n. */
static int
count_codes(const unsigned char *code, Py_ssize_t size, Py_ssize_t n, Py_ssize_t *counts)
{
    for (Py_ssize_t i = 0; i < size; i++) {
        if (code[i] >= n) {
            PyErr_Format(PyExc_ValueError, "code %d at %zd is not below %zd",
                         (int)code[i], i, n);
            return -1;
        }
        counts[code[i]]++;
    }
    return 0;
}

/* cut_column of an IntColumn: n IntColumns (every item is an exact number). */
static PyObject *
cut_int_column(const unsigned char *code, Py_ssize_t n, const Py_ssize_t *counts,
               PyObject *column, Py_ssize_t size)
{
    int64_t *dest[MAX_DESTINATIONS];
    if (Py_SIZE(column) != size) {
        PyErr_Format(PyExc_ValueError, "%zd codes for a column of %zd", size,
                     Py_SIZE(column));
        return NULL;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t p = 0; p < n; p++) {
        PyObject *piece = int_column_new(counts[p]);
        if (piece == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, p, piece);
        dest[p] = IntColumn_ITEMS(piece);
    }
    const int64_t *words = IntColumn_ITEMS(column);
    for (Py_ssize_t i = 0; i < size; i++)
        *dest[code[i]]++ = words[i];
    return out;
}

/* The list of n lists of `column` cut by code (`counts` from count_codes); when
 * `exact` is not NULL, *exact is cleared if an item is not an exact number. */
static PyObject *
cut_column(const unsigned char *code, Py_ssize_t n, const Py_ssize_t *counts,
           PyObject *column, Py_ssize_t size, int *exact)
{
    PyObject *dest[MAX_DESTINATIONS];
    Py_ssize_t filled[MAX_DESTINATIONS] = {0};
    if (IntColumn_Check(column))
        return cut_int_column(code, n, counts, column, size);
    PyObject *seq = PySequence_Fast(column, "column must be a list or a tuple");
    if (seq == NULL)
        return NULL;
    PyObject *out = NULL;
    if (PySequence_Fast_GET_SIZE(seq) != size) {
        PyErr_Format(PyExc_ValueError, "%zd codes for a column of %zd", size,
                     PySequence_Fast_GET_SIZE(seq));
        goto done;
    }
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t p = 0; p < n; p++) {
        dest[p] = PyList_New(counts[p]);
        if (dest[p] == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, p, dest[p]);
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int all_exact = exact != NULL && *exact;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *item = items[i];
        /* checked here, where the item is being touched anyway: a later pass over a
         * piece that waited in a channel would miss the cache on every item */
        if (all_exact)
            all_exact = is_exact_number(item);
        Py_INCREF(item);
        PyList_SET_ITEM(dest[code[i]], filled[code[i]]++, item);
    }
    if (exact != NULL)
        *exact = all_exact;
done:
    Py_DECREF(seq);
    return out;
}

/* split_column(codes, n, column) -> list of n lists: list p holds, in order, the
 * items of column whose code is p. */
static PyObject *
split_column(PyObject *module, PyObject *args)
{
    Py_buffer codes;
    Py_ssize_t n;
    PyObject *column, *out = NULL;
    Py_ssize_t counts[MAX_DESTINATIONS] = {0};
    if (!PyArg_ParseTuple(args, "y*nO:split_column", &codes, &n, &column))
        return NULL;
    const unsigned char *code = (const unsigned char *)codes.buf;
    if (check_destinations(n) == 0 && count_codes(code, codes.len, n, counts) == 0)
        out = cut_column(code, n, counts, column, codes.len, NULL);
    PyBuffer_Release(&codes);
    return out;
}

/* split_columns(codes, n, columns) -> (counts, cuts, exact): how many codes are p for
 * each p; for each column, what split_column gives; and whether every item of every
 * column is an exact number (see exact_numbers). One pass over the codes for all the
 * columns of a batch, and the exactness that decides whether a piece may skip the
 * codec found while the items are being touched anyway. */
static PyObject *
split_columns(PyObject *module, PyObject *args)
{
    Py_buffer codes;
    Py_ssize_t n;
    PyObject *columns, *counts_list = NULL, *cuts = NULL, *out = NULL;
    Py_ssize_t counts[MAX_DESTINATIONS] = {0}, ncolumns;
    int exact = 1;
    if (!PyArg_ParseTuple(args, "y*nO:split_columns", &codes, &n, &columns))
        return NULL;
    const unsigned char *code = (const unsigned char *)codes.buf;
    PyObject *seq = PySequence_Fast(columns, "columns must be a list or a tuple");
    if (seq == NULL || check_destinations(n) < 0
            || count_codes(code, codes.len, n, counts) < 0)
        goto done;
    ncolumns = PySequence_Fast_GET_SIZE(seq);
    if ((cuts = PyList_New(ncolumns)) == NULL || (counts_list = PyList_New(n)) == NULL)
        goto done;
    for (Py_ssize_t p = 0; p < n; p++) {
        PyObject *count = PyLong_FromSsize_t(counts[p]);
        if (count == NULL)
            goto done;
        PyList_SET_ITEM(counts_list, p, count);
    }
    for (Py_ssize_t c = 0; c < ncolumns; c++) {
        PyObject *cut = cut_column(code, n, counts, PySequence_Fast_GET_ITEM(seq, c),
                                   codes.len, &exact);
        if (cut == NULL)
            goto done;
        PyList_SET_ITEM(cuts, c, cut);
    }
    out = Py_BuildValue("(OOO)", counts_list, cuts, exact ? Py_True : Py_False);
done:
    Py_XDECREF(counts_list);
    Py_XDECREF(cuts);
    Py_XDECREF(seq);
    PyBuffer_Release(&codes);
    return out;
}

/* Words are little-endian on every host: written and read a byte at a time, which the
 * compiler turns into one move on little-endian machines. */
static inline void
put_word(unsigned char *to, uint64_t word, int width)
{
    for (int b = 0; b < width; b++)
        to[b] = (unsigned char)(word >> (8 * b));
}

static inline uint64_t
get_word(const unsigned char *from, int width)
{
    uint64_t word = 0;
    for (int b = 0; b < width; b++)
        word |= (uint64_t)from[b] << (8 * b);
    return word;
}

/* pack_ints of an IntColumn: its words, narrowed. */
static int
narrowest_width(long long low, long long high)
{
    if (low >= INT8_MIN && high <= INT8_MAX)
        return 1;
    if (low >= INT16_MIN && high <= INT16_MAX)
        return 2;
    if (low >= INT32_MIN && high <= INT32_MAX)
        return 4;
    return 8;
}

static PyObject *
pack_int_column(PyObject *column)
{
    Py_ssize_t size = Py_SIZE(column);
    const int64_t *words = IntColumn_ITEMS(column);
    int64_t low = 0, high = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        if (words[i] < low)
            low = words[i];
        if (words[i] > high)
            high = words[i];
    }
    int width = narrowest_width(low, high);
    PyObject *out = PyBytes_FromStringAndSize(NULL, 1 + size * width);
    if (out == NULL)
        return NULL;
    unsigned char *buf = (unsigned char *)PyBytes_AS_STRING(out);
    buf[0] = (unsigned char)width;
    buf++;
    switch (width) {
    case 1: for (Py_ssize_t i = 0; i < size; i++) buf[i] = (unsigned char)words[i]; break;
    case 2: for (Py_ssize_t i = 0; i < size; i++) put_word(buf + 2 * i, (uint64_t)words[i], 2); break;
    case 4: for (Py_ssize_t i = 0; i < size; i++) put_word(buf + 4 * i, (uint64_t)words[i], 4); break;
    default: for (Py_ssize_t i = 0; i < size; i++) put_word(buf + 8 * i, (uint64_t)words[i], 8);
    }
    return out;
}

/* pack_ints(column) -> bytes | None: when every item is exactly an int (not a bool,
 * not a subclass) that fits in 64 bits, one byte giving the item width w (1, 2, 4 or 8:
 * the narrowest that holds every item) and then the items as little-endian signed
 * w-byte integers; else None. */
static PyObject *
pack_ints(PyObject *module, PyObject *column)
{
    if (IntColumn_Check(column))
        return pack_int_column(column);
    PyObject *seq = PySequence_Fast(column, "column must be a list or a tuple");
    if (seq == NULL)
        return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    long long low = 0, high = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        int overflow = 0;
        if (!PyLong_CheckExact(items[i])) {
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        long long v;
        if (!compact_long(items[i], &v))
            v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (overflow) {
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        if (v < low)
            low = v;
        if (v > high)
            high = v;
    }
    int width = narrowest_width(low, high);
    PyObject *out = PyBytes_FromStringAndSize(NULL, 1 + size * width);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *buf = (unsigned char *)PyBytes_AS_STRING(out);
    buf[0] = (unsigned char)width;
    buf++;
    for (Py_ssize_t i = 0; i < size; i++) {
        /* items are exact ints that fit: no error here */
        long long v;
        if (!compact_long(items[i], &v))
            v = PyLong_AsLongLong(items[i]);
        put_word(buf + i * width, (uint64_t)v, width);
    }
    Py_DECREF(seq);
    return out;
}

/* pack_float64(column) -> bytes | None: exact floats as little-endian float64s
 * (IEEE 754 bits as they are: NaN payloads and -0.0 survive); else None. */
static PyObject *
pack_float64(PyObject *module, PyObject *column)
{
    if (IntColumn_Check(column))
        Py_RETURN_NONE;
    PyObject *seq = PySequence_Fast(column, "column must be a list or a tuple");
    if (seq == NULL)
        return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, size * 8);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    char *buf = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < size; i++) {
        if (!PyFloat_CheckExact(items[i])) {
            Py_DECREF(seq);
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        double v = PyFloat_AS_DOUBLE(items[i]);
        uint64_t word;
        memcpy(&word, &v, 8);
        put_word((unsigned char *)buf + i * 8, word, 8);
    }
    Py_DECREF(seq);
    return out;
}

static int
eight_byte_items(Py_buffer *data)
{
    if (data->len % 8) {
        PyErr_Format(PyExc_ValueError, "a packed column of %zd bytes is not whole 8-byte "
                     "items", data->len);
        return 0;
    }
    return 1;
}

/* Item i of a new tuple: the float whose IEEE 754 bits are `bits`; 0 on failure. */
static int
set_float_bits(PyObject *tuple, Py_ssize_t i, uint64_t bits)
{
    double v;
    memcpy(&v, &bits, 8);
    PyObject *item = PyFloat_FromDouble(v);
    if (item == NULL)
        return 0;
    PyTuple_SET_ITEM(tuple, i, item);
    return 1;
}

/* unpack_float64(data) -> tuple of floats */
static PyObject *
unpack_float64(PyObject *module, PyObject *args)
{
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*:unpack_float64", &data))
        return NULL;
    PyObject *out = NULL;
    if (!eight_byte_items(&data))
        goto done;
    Py_ssize_t size = data.len / 8;
    out = PyTuple_New(size);
    if (out == NULL)
        goto done;
    const unsigned char *buf = (const unsigned char *)data.buf;
    for (Py_ssize_t i = 0; i < size; i++) {
        if (!set_float_bits(out, i, get_word(buf + i * 8, 8))) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    PyBuffer_Release(&data);
    return out;
}

/* pack_float64_xor(column) -> bytes | None: exact floats, each as its IEEE 754 bits
 * XOR the bits of the item before it (the first item's against 0): a header byte, its
 * high nibble the zero bytes above the significant ones, its low nibble how many are
 * stored, then those bytes, little-endian (an item equal to the one before is the
 * header 0x80 alone). Nearby values — a column of event times — keep 2-3 of their 8
 * bytes, and every bit survives (NaN payloads, -0.0); else None. */
static PyObject *
pack_float64_xor(PyObject *module, PyObject *column)
{
    if (IntColumn_Check(column))
        Py_RETURN_NONE;
    PyObject *seq = PySequence_Fast(column, "column must be a list or a tuple");
    if (seq == NULL)
        return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (size > PY_SSIZE_T_MAX / 9) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size * 9);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *buf = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t at = 0;
    uint64_t previous = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        if (!PyFloat_CheckExact(items[i])) {
            Py_DECREF(seq);
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        double v = PyFloat_AS_DOUBLE(items[i]);
        uint64_t bits;
        memcpy(&bits, &v, 8);
        uint64_t x = bits ^ previous;
        previous = bits;
        if (x == 0) {
            buf[at++] = 0x80;
            continue;
        }
        int lead = __builtin_clzll(x) / 8, trail = __builtin_ctzll(x) / 8;
        int count = 8 - lead - trail;
        buf[at++] = (unsigned char)(lead << 4 | count);
        x >>= 8 * trail;
        for (int b = 0; b < count; b++)
            buf[at++] = (unsigned char)(x >> (8 * b));
    }
    Py_DECREF(seq);
    if (_PyBytes_Resize(&out, at) < 0)
        return NULL;
    return out;
}

/* unpack_float64_xor(data) -> tuple of floats: what pack_float64_xor packed;
 * ValueError for a header that is not one or an item cut short. */
static PyObject *
unpack_float64_xor(PyObject *module, PyObject *args)
{
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*:unpack_float64_xor", &data))
        return NULL;
    PyObject *out = NULL;
    const unsigned char *buf = (const unsigned char *)data.buf;
    Py_ssize_t size = 0;
    for (Py_ssize_t at = 0; at < data.len; size++) {
        int lead = buf[at] >> 4, count = buf[at] & 0x0f;
        if (lead + count > 8 || (count == 0) != (lead == 8)) {
            PyErr_Format(PyExc_ValueError, "byte %zd: 0x%02x is not an item's header", at,
                         buf[at]);
            goto done;
        }
        at += 1 + count;
        if (at > data.len) {
            PyErr_Format(PyExc_ValueError, "the last item is cut short (%zd bytes)",
                         data.len);
            goto done;
        }
    }
    out = PyTuple_New(size);
    if (out == NULL)
        goto done;
    uint64_t bits = 0;
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        int lead = buf[at] >> 4, count = buf[at] & 0x0f;
        at++;
        uint64_t x = 0;
        for (int b = 0; b < count; b++)
            x |= (uint64_t)buf[at + b] << (8 * b);
        at += count;
        if (count)
            x <<= 8 * (8 - lead - count);
        bits ^= x;
        if (!set_float_bits(out, i, bits)) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    PyBuffer_Release(&data);
    return out;
}

/* pack_int_deltas(column) -> bytes | None: when every item is exactly an int that fits
 * in 64 bits and so does each difference to the item before it, a width byte with DELTAS
 * set (w: the narrowest of 1, 2, 4 or 8 bytes that holds every difference), the first
 * item as a little-endian 8-byte word, then each later item's difference to the one
 * before as a little-endian signed w-byte int: numbers that climb one by one (the
 * firing numbers of a key) take a byte each, however large; else None. unpack_ints and
 * unpack_int_column add them back up. */
#define DELTAS 0x80

static PyObject *
pack_int_deltas(PyObject *module, PyObject *column)
{
    PyObject *seq = PySequence_Fast(column, "column must be a list or a tuple");
    if (seq == NULL)
        return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    long long low = 0, high = 0, previous = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        int overflow = 0;
        long long v, d;
        if (!PyLong_CheckExact(items[i]))
            goto none;
        if (!compact_long(items[i], &v))
            v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (overflow || (i && __builtin_sub_overflow(v, previous, &d)))
            goto none;
        if (i && d < low)
            low = d;
        if (i && d > high)
            high = d;
        previous = v;
    }
    int width = narrowest_width(low, high);
    PyObject *out = PyBytes_FromStringAndSize(NULL, size ? 9 + (size - 1) * width : 1);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *buf = (unsigned char *)PyBytes_AS_STRING(out);
    buf[0] = (unsigned char)(width | DELTAS);
    for (Py_ssize_t i = 0; i < size; i++) {
        long long v;   /* exact ints whose differences fit: no error here */
        if (!compact_long(items[i], &v))
            v = PyLong_AsLongLong(items[i]);
        if (i == 0)
            put_word(buf + 1, (uint64_t)v, 8);
        else
            put_word(buf + 9 + (i - 1) * width, (uint64_t)v - (uint64_t)previous, width);
        previous = v;
    }
    Py_DECREF(seq);
    return out;
none:
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

/* exact_numbers(column) -> bool: every item is exactly an int that fits in 64 bits or
 * exactly a float: values that a msgpack round trip gives back equal and of the same
 * type, and that nobody can mutate. */
static PyObject *
exact_numbers(PyObject *module, PyObject *column)
{
    if (IntColumn_Check(column))
        Py_RETURN_TRUE;
    PyObject *seq = PySequence_Fast(column, "column must be a list or a tuple");
    if (seq == NULL)
        return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int exact = 1;
    for (Py_ssize_t i = 0; i < size && exact; i++)
        exact = is_exact_number(items[i]);
    Py_DECREF(seq);
    return PyBool_FromLong(exact);
}

/* field_column(rows, index) -> list: item `index` of every row (a tuple, or any
 * sequence), in order: what list(map(itemgetter(index), rows)) gives, in one pass. */
static PyObject *
field_column(PyObject *module, PyObject *args)
{
    PyObject *rows;
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "On:field_column", &rows, &index))
        return NULL;
    PyObject *seq = PySequence_Fast(rows, "rows must be a list or a tuple");
    if (seq == NULL)
        return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(size);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *row = items[i], *item;
        if (PyTuple_CheckExact(row) && index >= 0 && index < PyTuple_GET_SIZE(row)) {
            item = PyTuple_GET_ITEM(row, index);
            Py_INCREF(item);
        } else {
            item = PySequence_GetItem(row, index);  /* raises as itemgetter would */
            if (item == NULL) {
                Py_DECREF(out);
                Py_DECREF(seq);
                return NULL;
            }
        }
        PyList_SET_ITEM(out, i, item);
    }
    Py_DECREF(seq);
    return out;
}

/* float64_runs(column) -> (bytes, list) | None: when every item is exactly a float, the
 * column run-length encoded: each run of consecutive items with the same bits, its
 * value once as a little-endian float64 and its length in the list; else None. */
static PyObject *
float64_runs(PyObject *module, PyObject *column)
{
    PyObject *seq = PySequence_Fast(column, "column must be a list or a tuple");
    if (seq == NULL)
        return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *values = NULL, *lengths = NULL, *out = NULL;
    Py_ssize_t runs = 0;
    uint64_t previous = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        if (!PyFloat_CheckExact(items[i])) {
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        double v = PyFloat_AS_DOUBLE(items[i]);
        uint64_t word;
        memcpy(&word, &v, 8);
        if (i == 0 || word != previous)
            runs++;
        previous = word;
    }
    values = PyBytes_FromStringAndSize(NULL, runs * 8);
    lengths = PyList_New(runs);
    if (values == NULL || lengths == NULL)
        goto done;
    unsigned char *buf = (unsigned char *)PyBytes_AS_STRING(values);
    Py_ssize_t run = -1, start = 0;
    for (Py_ssize_t i = 0; i <= size; i++) {
        uint64_t word = 0;
        if (i < size) {
            double v = PyFloat_AS_DOUBLE(items[i]);
            memcpy(&word, &v, 8);
        }
        if (i == size || i == 0 || word != previous) {
            if (run >= 0) {
                PyObject *length = PyLong_FromSsize_t(i - start);
                if (length == NULL)
                    goto done;
                PyList_SET_ITEM(lengths, run, length);
            }
            if (i == size)
                break;
            run++;
            start = i;
            put_word(buf + run * 8, word, 8);
        }
        previous = word;
    }
    out = PyTuple_Pack(2, values, lengths);
done:
    Py_XDECREF(values);
    Py_XDECREF(lengths);
    Py_DECREF(seq);
    return out;
}


/* -- keyed folds of the built-in aggregations ------------------------------------------
 *
 * fold_keyed(kind, state, keys, values, start, out, opened) -> int: a running
 * aggregation per key, folded in C: for each record i from `start`, the accumulator of
 * keys[i] in the dict `state` (a fresh one when the key is missing, and the key
 * appended to `opened` when that is a list) takes values[i], is stored back, and
 * (key, result) is appended to `out` (unless `out` is None). Returns the position of the first record it did
 * not fold, len(values) when it folded them all: a record whose value or accumulator
 * is not a plain number (an exact int or an exact float; `columns.fold_keyed` says
 * what each kind accepts), which the caller folds in Python and then calls again after
 * it. So state and out always hold exactly records start..returned-1, and the result
 * is the one the Python aggregation computes, bit for bit: arithmetic on two floats or
 * two small ints is done here in machine words with the same IEEE operations CPython
 * does, and every other pairing (an int beyond 64 bits, an int with a float, a
 * comparison of an int with a float, which Python makes exactly) goes through the
 * number protocol of those exact types, which runs no user code. */

enum { FOLD_COUNT = 0, FOLD_SUM = 1, FOLD_MIN = 2, FOLD_MAX = 3, FOLD_MEAN = 4 };

/* a + b of two exact numbers, as Python computes it */
static PyObject *
add_numbers(PyObject *a, PyObject *b)
{
    if (PyFloat_CheckExact(a) && PyFloat_CheckExact(b))
        return PyFloat_FromDouble(PyFloat_AS_DOUBLE(a) + PyFloat_AS_DOUBLE(b));
    long long x, y, z;
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b) && compact_long(a, &x)
            && compact_long(b, &y) && !__builtin_add_overflow(x, y, &z))
        return PyLong_FromLongLong(z);
    return PyNumber_Add(a, b);
}

/* Is `candidate` the new extreme against `acc` (candidate < acc for min, > for max)?
 * What builtin min/max of (acc, candidate) decide: 1, 0, or -1 on error. */
static int
beats(PyObject *candidate, PyObject *acc, int op)
{
    if (PyFloat_CheckExact(candidate) && PyFloat_CheckExact(acc)) {
        double c = PyFloat_AS_DOUBLE(candidate), a = PyFloat_AS_DOUBLE(acc);
        return op == Py_LT ? c < a : c > a;
    }
    long long c, a;
    if (PyLong_CheckExact(candidate) && PyLong_CheckExact(acc)
            && compact_long(candidate, &c) && compact_long(acc, &a))
        return op == Py_LT ? c < a : c > a;
    return PyObject_RichCompareBool(candidate, acc, op);
}

static inline int
is_number(PyObject *o)
{
    return PyFloat_CheckExact(o) || PyLong_CheckExact(o);
}

/* The new accumulator of `kind` after `value` (acc NULL: the key is new), its result
 * in *result (a new reference); NULL with no error set: not plain numbers, fold it in
 * Python; NULL with an error set: a real error (memory). */
static PyObject *
fold_one(int kind, PyObject *acc, PyObject *value, PyObject **result)
{
    PyObject *next = NULL;
    switch (kind) {
    case FOLD_COUNT: {
        long long c = 0;
        if (acc == NULL)
            next = PyLong_FromLong(1);
        else if (!PyLong_CheckExact(acc))
            return NULL;
        else if (compact_long(acc, &c) && c < LLONG_MAX)
            next = PyLong_FromLongLong(c + 1);
        else {
            PyObject *one = PyLong_FromLong(1);
            if (one == NULL)
                return NULL;
            next = PyNumber_Add(acc, one);
            Py_DECREF(one);
        }
        break;
    }
    case FOLD_SUM:
        if (!is_number(value) || (acc != NULL && !is_number(acc)))
            return NULL;
        if (acc == NULL) {
            /* Sum starts at int 0: 0 + value is value itself, but for a float the sum
             * of int 0 and -0.0 is 0.0 */
            if (PyFloat_CheckExact(value))
                next = PyFloat_FromDouble(0.0 + PyFloat_AS_DOUBLE(value));
            else {
                next = value;
                Py_INCREF(next);
            }
        } else
            next = add_numbers(acc, value);
        break;
    case FOLD_MIN:
    case FOLD_MAX: {
        if (!is_number(value) || (acc != NULL && acc != Py_None && !is_number(acc)))
            return NULL;
        if (acc == NULL || acc == Py_None) {
            next = value;
        } else {
            int b = beats(value, acc, kind == FOLD_MIN ? Py_LT : Py_GT);
            if (b < 0)
                return NULL;
            next = b ? value : acc;
        }
        Py_INCREF(next);
        break;
    }
    case FOLD_MEAN: {
        PyObject *sum = NULL, *count = NULL;
        long long c = 0;
        if (!is_number(value))
            return NULL;
        if (acc != NULL) {
            if (!PyTuple_CheckExact(acc) || PyTuple_GET_SIZE(acc) != 2)
                return NULL;
            sum = PyTuple_GET_ITEM(acc, 0);
            count = PyTuple_GET_ITEM(acc, 1);
            /* a count of more than 2**62 records is not a plain count */
            if (!is_number(sum) || !PyLong_CheckExact(count) || !compact_long(count, &c)
                    || c < 0 || c > ((long long)1 << 62))
                return NULL;
        }
        PyObject *new_sum;
        if (sum == NULL) {
            if (PyFloat_CheckExact(value))
                new_sum = PyFloat_FromDouble(0.0 + PyFloat_AS_DOUBLE(value));
            else {
                new_sum = value;
                Py_INCREF(new_sum);
            }
        } else
            new_sum = add_numbers(sum, value);
        if (new_sum == NULL)
            return NULL;
        PyObject *new_count = PyLong_FromLongLong(c + 1);
        if (new_count == NULL) {
            Py_DECREF(new_sum);
            return NULL;
        }
        /* sum / count, as Mean.result: a float over a count below 2**53 divides in
         * doubles as CPython's float division does; an int sum divides exactly
         * rounded (int / int), through the number protocol */
        if (PyFloat_CheckExact(new_sum))
            *result = PyFloat_FromDouble(PyFloat_AS_DOUBLE(new_sum) / (double)(c + 1));
        else
            *result = PyNumber_TrueDivide(new_sum, new_count);
        if (*result == NULL) {
            Py_DECREF(new_sum);
            Py_DECREF(new_count);
            return NULL;
        }
        next = PyTuple_New(2);
        if (next == NULL) {
            Py_DECREF(new_sum);
            Py_DECREF(new_count);
            Py_CLEAR(*result);
            return NULL;
        }
        PyTuple_SET_ITEM(next, 0, new_sum);
        PyTuple_SET_ITEM(next, 1, new_count);
        return next;
    }
    default:
        PyErr_Format(PyExc_ValueError, "unknown fold kind %d", kind);
        return NULL;
    }
    if (next != NULL) {
        *result = next;  /* the result of Count, Sum, Min and Max is the accumulator */
        Py_INCREF(next);
    }
    return next;
}

/* The keys a batch folds, each with its accumulator while the batch is folded: read
 * from `state` when the key first comes up, written back once at the end. A batch of
 * thousands of records has a few distinct keys at most in a keyed count, so this
 * open-addressed table saves the two dict operations per record (the lookup and the
 * store, each a hash, a probe and a compare) for one probe that usually matches by
 * identity (small ints are shared objects). Keys match as in a dict: the same object,
 * or an equal hash and ==, so 1, 1.0 and True are one key here as in `state`. */
typedef struct {
    PyObject *key;   /* the first record's key object (a new reference) */
    Py_hash_t hash;
    PyObject *acc;   /* NULL while the key has no accumulator */
    int is_new;      /* not in `state` before this batch */
} Slot;

typedef struct {
    Slot *slots;
    Py_ssize_t mask;       /* capacity - 1, a power of two */
    Py_ssize_t *order;     /* slot indices, in the order keys first came up */
    Py_ssize_t used;
} KeyTable;

/* A table's zeroed slots (`capacity` of `slot_size` bytes) and its order array (it
 * is kept at most half full); -1 and MemoryError when either cannot be had. */
static int
table_alloc(void **slots, Py_ssize_t **order, Py_ssize_t capacity, size_t slot_size)
{
    *slots = PyMem_Calloc(capacity, slot_size);
    *order = PyMem_Malloc(sizeof(Py_ssize_t) * (capacity / 2 + 1));
    if (*slots == NULL || *order == NULL) {
        PyMem_Free(*slots);
        PyMem_Free(*order);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int
table_init(KeyTable *t, Py_ssize_t capacity)
{
    t->mask = capacity - 1;
    t->used = 0;
    return table_alloc((void **)&t->slots, &t->order, capacity, sizeof(Slot));
}

/* Double the capacity: rehash the used slots (their references move). */
static int
table_grow(KeyTable *t)
{
    KeyTable bigger;
    if (table_init(&bigger, 2 * (t->mask + 1)) < 0)
        return -1;
    for (Py_ssize_t o = 0; o < t->used; o++) {
        Slot *old = &t->slots[t->order[o]];
        Py_ssize_t i = (Py_ssize_t)((size_t)old->hash & (size_t)bigger.mask);
        while (bigger.slots[i].key != NULL)
            i = (i + 1) & bigger.mask;
        bigger.slots[i] = *old;
        bigger.order[bigger.used++] = i;
    }
    PyMem_Free(t->slots);
    PyMem_Free(t->order);
    *t = bigger;
    return 0;
}

/* The slot of `key`, made (its accumulator read from `state`) when missing; NULL on
 * an error (a key's __hash__ or __eq__ raised, memory). */
static Slot *
table_slot(KeyTable *t, PyObject *key, PyObject *state)
{
    Py_hash_t hash = PyObject_Hash(key);
    if (hash == -1)
        return NULL;
    Py_ssize_t i = (Py_ssize_t)((size_t)hash & (size_t)t->mask);
    for (;;) {
        Slot *slot = &t->slots[i];
        if (slot->key == NULL)
            break;
        if (slot->key == key)
            return slot;
        if (slot->hash == hash) {
            int eq = PyObject_RichCompareBool(slot->key, key, Py_EQ);
            if (eq < 0)
                return NULL;
            if (eq)
                return slot;
        }
        i = (i + 1) & t->mask;
    }
    PyObject *acc = PyDict_GetItemWithError(state, key);  /* borrowed */
    if (acc == NULL && PyErr_Occurred())
        return NULL;
    if (2 * (t->used + 1) > t->mask + 1) {  /* keep it at most half full */
        Py_XINCREF(acc);  /* growing runs no user code, but hold it anyway */
        int grown = table_grow(t);
        Py_XDECREF(acc);
        if (grown < 0)
            return NULL;
        return table_slot(t, key, state);
    }
    Slot *slot = &t->slots[i];
    Py_INCREF(key);
    Py_XINCREF(acc);
    slot->key = key;
    slot->hash = hash;
    slot->acc = acc;
    slot->is_new = acc == NULL;
    t->order[t->used++] = i;
    return slot;
}

/* Store every folded accumulator in `state` and note the new keys in `opened`, in the
 * order the keys first came up (the order record-by-record stores would give), then
 * release the table. -1 if a store failed (the table is released all the same). */
static int
table_flush(KeyTable *t, PyObject *state, PyObject *opened)
{
    int status = 0;
    for (Py_ssize_t o = 0; o < t->used; o++) {
        Slot *slot = &t->slots[t->order[o]];
        if (status == 0 && slot->acc != NULL) {
            if (PyDict_SetItem(state, slot->key, slot->acc) < 0
                    || (slot->is_new && opened != Py_None
                        && PyList_Append(opened, slot->key) < 0))
                status = -1;
        }
        Py_DECREF(slot->key);
        Py_XDECREF(slot->acc);
    }
    PyMem_Free(t->slots);
    PyMem_Free(t->order);
    return status;
}

static PyObject *
fold_keyed(PyObject *module, PyObject *args)
{
    int kind;
    PyObject *state, *keys, *values, *out, *opened;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "iO!OOnOO:fold_keyed", &kind, &PyDict_Type, &state, &keys,
                          &values, &start, &out, &opened))
        return NULL;
    if (out != Py_None && !PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a list or None");
        return NULL;
    }
    if (kind < FOLD_COUNT || kind > FOLD_MEAN) {
        PyErr_Format(PyExc_ValueError, "unknown fold kind %d", kind);
        return NULL;
    }
    if (opened != Py_None && !PyList_Check(opened)) {
        PyErr_SetString(PyExc_TypeError, "opened must be a list or None");
        return NULL;
    }
    PyObject *kseq = PySequence_Fast(keys, "keys must be a list or a tuple");
    if (kseq == NULL)
        return NULL;
    PyObject *vseq = PySequence_Fast(values, "values must be a list or a tuple");
    if (vseq == NULL) {
        Py_DECREF(kseq);
        return NULL;
    }
    PyObject *pairs = NULL;
    KeyTable table = {NULL, 0, NULL, 0};
    int have_table = 0, failed = 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(vseq);
    Py_ssize_t i = start < 0 ? 0 : start > n ? n : start, first = i;
    if (PySequence_Fast_GET_SIZE(kseq) != n) {
        PyErr_Format(PyExc_ValueError, "%zd keys for %zd values",
                     PySequence_Fast_GET_SIZE(kseq), n);
        goto fail;
    }
    /* the (key, result) pairs of records first..i-1, appended to `out` at the end
     * (none made when `out` is None: a window keeps accumulators, emits nothing) */
    if ((out != Py_None && (pairs = PyList_New(n - first)) == NULL)
            || table_init(&table, 64) < 0)
        goto fail;
    have_table = 1;
    for (; i < n; i++) {
        /* a key's __hash__ / __eq__ is user code: hold what we read, and re-read the
         * sizes, so that nothing it does can leave us reading freed memory */
        if (i >= PySequence_Fast_GET_SIZE(kseq) || i >= PySequence_Fast_GET_SIZE(vseq)) {
            PyErr_SetString(PyExc_RuntimeError, "a column changed size during a fold");
            failed = 1;
            break;
        }
        PyObject *key = PySequence_Fast_GET_ITEM(kseq, i);
        PyObject *value = PySequence_Fast_GET_ITEM(vseq, i);
        Py_INCREF(key);
        Py_INCREF(value);
        Slot *slot = table_slot(&table, key, state);
        PyObject *result = NULL, *next = NULL;
        if (slot != NULL)
            next = fold_one(kind, slot->acc, value, &result);
        Py_DECREF(value);
        if (next == NULL) {
            Py_DECREF(key);
            failed = PyErr_Occurred() != NULL;
            break;  /* an error, or not plain numbers: the caller folds record i */
        }
        Py_XSETREF(slot->acc, next);
        if (pairs == NULL) {
            Py_DECREF(result);
            Py_DECREF(key);
            continue;
        }
        PyObject *pair = PyTuple_Pack(2, key, result);
        Py_DECREF(result);
        Py_DECREF(key);
        if (pair == NULL) {
            failed = 1;
            break;
        }
        PyList_SET_ITEM(pairs, i - first, pair);
    }
    have_table = 0;
    if (table_flush(&table, state, opened) < 0)
        failed = 1;
    /* the pairs made, whether or not the fold went to the end: `state` holds them */
    if (pairs != NULL && (PyList_SetSlice(pairs, i - first, n - first, NULL) < 0
            || PyList_SetSlice(out, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, pairs) < 0))
        failed = 1;
    if (failed)
        goto fail;
    Py_XDECREF(pairs);
    Py_DECREF(kseq);
    Py_DECREF(vseq);
    return PyLong_FromSsize_t(i);
fail:
    if (have_table)
        table_flush(&table, state, opened);
    Py_XDECREF(pairs);
    Py_DECREF(kseq);
    Py_DECREF(vseq);
    return NULL;
}

/* The IntColumn of what pack_ints packed; NULL and ValueError when `data` is not a
 * packed int column. */
static PyObject *
column_of_packed(const Py_buffer *data)
{
    const unsigned char *buf = (const unsigned char *)data->buf;
    int width = data->len ? buf[0] & ~DELTAS : 0;
    int deltas = data->len && (buf[0] & DELTAS);
    /* a column of differences starts with its first item, a whole word */
    Py_ssize_t first = deltas && data->len > 1 ? 8 : 0;
    if (!(width == 1 || width == 2 || width == 4 || width == 8)
            || data->len - 1 < first || (data->len - 1 - first) % width) {
        PyErr_Format(PyExc_ValueError, "%zd bytes are not a packed int column", data->len);
        return NULL;
    }
    Py_ssize_t words = (data->len - 1 - first) / width;   /* after the first item */
    Py_ssize_t size = words + (first ? 1 : 0);
    PyObject *out = int_column_new(size);
    if (out == NULL)
        return NULL;
    int64_t *items = IntColumn_ITEMS(out);
    int64_t *to = items + (first ? 1 : 0);
    buf++;
    if (first) {
        uint64_t u = get_word(buf, 8);
        memcpy(items, &u, 8);
        buf += 8;
    }
    if (width == 1) {
        for (Py_ssize_t i = 0; i < words; i++)
            to[i] = (int8_t)buf[i];
    }
    else {
        for (Py_ssize_t i = 0; i < words; i++) {
            uint64_t u = get_word(buf + i * width, width);
            if (width < 8 && (u >> (8 * width - 1)) & 1)  /* sign-extend */
                u |= ~(uint64_t)0 << (8 * width);
            memcpy(&to[i], &u, 8);
        }
    }
    if (first) {   /* in unsigned words: a damaged column wraps, it does not trap */
        uint64_t sum;
        memcpy(&sum, items, 8);
        for (Py_ssize_t i = 1; i < size; i++) {
            sum += (uint64_t)items[i];
            memcpy(&items[i], &sum, 8);
        }
    }
    return out;
}

/* unpack_int_column(data) -> IntColumn: what pack_ints packed, as words. */
static PyObject *
unpack_int_column(PyObject *module, PyObject *args)
{
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*:unpack_int_column", &data))
        return NULL;
    PyObject *out = column_of_packed(&data);
    PyBuffer_Release(&data);
    return out;
}

/* unpack_ints(data) -> tuple of ints: what pack_ints packed */
static PyObject *
unpack_ints(PyObject *module, PyObject *args)
{
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*:unpack_ints", &data))
        return NULL;
    PyObject *column = column_of_packed(&data);
    PyBuffer_Release(&data);
    if (column == NULL)
        return NULL;
    PyObject *out = PySequence_Tuple(column);
    Py_DECREF(column);
    return out;
}

/* -- keyed folds over IntColumns ------------------------------------------------------
 *
 * fold_int_column(kind, state, keys, values, opened) -> IntColumn | None: fold_keyed
 * of Count, Sum, Min or Max over an IntColumn of keys (and, but for Count, an
 * IntColumn of values) in machine words, all or nothing: the results column, every
 * accumulator stored in `state` and every new key appended to `opened` (a list or
 * None) as fold_keyed would; or None, with `state` untouched, when an accumulator in
 * `state` is not an int of 64 bits (None too for Min and Max) or an accumulator would
 * leave 64 bits. The caller then folds the batch through fold_keyed, whose results are
 * the same: the ints here are the Python ints there, without the objects. */

typedef struct {
    int64_t key;
    int64_t acc;
    unsigned char used, has_acc, is_new;
} WordSlot;

typedef struct {
    WordSlot *slots;
    Py_ssize_t mask;
    Py_ssize_t *order;
    Py_ssize_t used;
} WordTable;

static int
word_table_init(WordTable *t, Py_ssize_t capacity)
{
    t->mask = capacity - 1;
    t->used = 0;
    return table_alloc((void **)&t->slots, &t->order, capacity, sizeof(WordSlot));
}

static void
word_table_free(WordTable *t)
{
    PyMem_Free(t->slots);
    PyMem_Free(t->order);
}

static inline size_t
word_hash(int64_t key)
{
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h ^ (h >> 29));
}

static inline Py_ssize_t
word_probe(const WordTable *t, int64_t key)
{
    Py_ssize_t i = (Py_ssize_t)(word_hash(key) & (size_t)t->mask);
    while (t->slots[i].used && t->slots[i].key != key)
        i = (i + 1) & t->mask;
    return i;
}

static int
word_table_grow(WordTable *t)
{
    WordTable bigger;
    if (word_table_init(&bigger, 2 * (t->mask + 1)) < 0)
        return -1;
    for (Py_ssize_t o = 0; o < t->used; o++) {
        WordSlot *old = &t->slots[t->order[o]];
        Py_ssize_t i = word_probe(&bigger, old->key);
        bigger.slots[i] = *old;
        bigger.order[bigger.used++] = i;
    }
    word_table_free(t);
    *t = bigger;
    return 0;
}

/* The slot of `key`, its accumulator read from `state` when it first comes up: NULL
 * with no error when that accumulator is not a word this fold takes, NULL with an
 * error on a real one. */
static WordSlot *
word_slot(WordTable *t, int64_t key, PyObject *state, int kind)
{
    Py_ssize_t i = word_probe(t, key);
    if (t->slots[i].used)
        return &t->slots[i];
    if (2 * (t->used + 1) > t->mask + 1) {
        if (word_table_grow(t) < 0)
            return NULL;
        i = word_probe(t, key);
    }
    PyObject *key_object = PyLong_FromLongLong(key);
    if (key_object == NULL)
        return NULL;
    PyObject *acc = PyDict_GetItemWithError(state, key_object);  /* borrowed */
    Py_DECREF(key_object);
    if (acc == NULL && PyErr_Occurred())
        return NULL;
    WordSlot slot = {key, 0, 1, 0, acc == NULL};
    if (acc != NULL && !(acc == Py_None && (kind == FOLD_MIN || kind == FOLD_MAX))) {
        long long v;
        int overflow = 0;
        if (!PyLong_CheckExact(acc))
            return NULL;
        if (!compact_long(acc, &v))
            v = PyLong_AsLongLongAndOverflow(acc, &overflow);
        if (overflow)
            return NULL;
        slot.acc = v;
        slot.has_acc = 1;
    }
    t->slots[i] = slot;
    t->order[t->used++] = i;
    return &t->slots[i];
}

static PyObject *
fold_int_column(PyObject *module, PyObject *args)
{
    int kind;
    PyObject *state, *keys, *values, *opened;
    if (!PyArg_ParseTuple(args, "iO!OOO:fold_int_column", &kind, &PyDict_Type, &state,
                          &keys, &values, &opened))
        return NULL;
    if (opened != Py_None && !PyList_Check(opened)) {
        PyErr_SetString(PyExc_TypeError, "opened must be a list or None");
        return NULL;
    }
    if (kind < FOLD_COUNT || kind > FOLD_MAX || !IntColumn_Check(keys)
            || (kind != FOLD_COUNT && !IntColumn_Check(values)))
        Py_RETURN_NONE;
    Py_ssize_t n = Py_SIZE(keys);
    if (PyObject_Length(values) != n) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%zd keys for %zd values", n,
                         PyObject_Length(values));
        return NULL;
    }
    PyObject *results = int_column_new(n);
    if (results == NULL)
        return NULL;
    WordTable table;
    if (word_table_init(&table, 64) < 0) {
        Py_DECREF(results);
        return NULL;
    }
    const int64_t *key_words = IntColumn_ITEMS(keys);
    const int64_t *value_words = kind == FOLD_COUNT ? NULL : IntColumn_ITEMS(values);
    int64_t *out = IntColumn_ITEMS(results);
    for (Py_ssize_t i = 0; i < n; i++) {
        WordSlot *slot = word_slot(&table, key_words[i], state, kind);
        if (slot == NULL)
            goto give_up;
        int64_t acc = slot->acc;
        switch (kind) {
        case FOLD_COUNT:
            if (slot->has_acc && __builtin_add_overflow(acc, 1, &acc))
                goto give_up;
            if (!slot->has_acc)
                acc = 1;
            break;
        case FOLD_SUM:
            if (!slot->has_acc)
                acc = value_words[i];
            else if (__builtin_add_overflow(acc, value_words[i], &acc))
                goto give_up;
            break;
        case FOLD_MIN:
            if (!slot->has_acc || value_words[i] < acc)
                acc = value_words[i];
            break;
        default:  /* FOLD_MAX */
            if (!slot->has_acc || value_words[i] > acc)
                acc = value_words[i];
        }
        slot->acc = acc;
        slot->has_acc = 1;
        out[i] = acc;
    }
    /* every record folded: store the accumulators, in the order the keys came up */
    for (Py_ssize_t o = 0; o < table.used; o++) {
        WordSlot *slot = &table.slots[table.order[o]];
        PyObject *key = PyLong_FromLongLong(slot->key);
        PyObject *acc = key == NULL ? NULL : PyLong_FromLongLong(slot->acc);
        int status = acc == NULL ? -1 : PyDict_SetItem(state, key, acc);
        if (status == 0 && slot->is_new && opened != Py_None)
            status = PyList_Append(opened, key);
        Py_XDECREF(key);
        Py_XDECREF(acc);
        if (status < 0) {
            word_table_free(&table);
            Py_DECREF(results);
            return NULL;
        }
    }
    word_table_free(&table);
    return results;
give_up:
    word_table_free(&table);
    Py_DECREF(results);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"partitions", partitions, METH_VARARGS, "memo[key] for every key, as bytes"},
    {"split_column", split_column, METH_VARARGS, "a column cut by destination code"},
    {"split_columns", split_columns, METH_VARARGS,
     "columns cut by destination code, with the counts and their exactness"},
    {"pack_ints", pack_ints, METH_O, "a column of exact ints as narrow words, or None"},
    {"pack_float64", pack_float64, METH_O, "a column of exact floats as float64s, or None"},
    {"unpack_ints", unpack_ints, METH_VARARGS, "packed ints back to a tuple"},
    {"exact_numbers", exact_numbers, METH_O, "are all items exact ints (64-bit) or floats?"},
    {"unpack_float64", unpack_float64, METH_VARARGS, "float64s back to a tuple of floats"},
    {"pack_float64_xor", pack_float64_xor, METH_O,
     "exact floats as each one's bits XOR the one before, significant bytes only, or None"},
    {"unpack_float64_xor", unpack_float64_xor, METH_VARARGS,
     "what pack_float64_xor packed, back to a tuple of floats"},
    {"pack_int_deltas", pack_int_deltas, METH_O,
     "exact ints as narrow differences to the item before, or None"},
    {"field_column", field_column, METH_VARARGS, "item `index` of every row, as a list"},
    {"float64_runs", float64_runs, METH_O, "exact floats run-length encoded, or None"},
    {"unpack_int_column", unpack_int_column, METH_VARARGS, "packed ints as an IntColumn"},
    {"int_column", int_column_from, METH_O,
     "an IntColumn of a column of ints (64-bit), or None"},
    {"pair_column", pair_column_from, METH_VARARGS, "the pairs of two IntColumns"},
    {"fold_int_column", fold_int_column, METH_VARARGS,
     "Count, Sum, Min or Max folded per key over IntColumns, or None"},
    {"fold_keyed", fold_keyed, METH_VARARGS,
     "a built-in aggregation folded per key over columns of plain numbers"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bastion.runtime._columns",
    "Column kernels of the keyed exchange (see bastion.runtime.columns).", -1, methods,
};

PyMODINIT_FUNC
PyInit__columns(void)
{
    if (PyType_Ready(&IntColumnType) < 0 || PyType_Ready(&IntColumnIterType) < 0
            || PyType_Ready(&PairColumnType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "IntColumn", (PyObject *)&IntColumnType) < 0
            || PyModule_AddObjectRef(m, "PairColumn", (PyObject *)&PairColumnType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
