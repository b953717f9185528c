/* Packed runs of durable values, in C: what a CEC burst holds of its parts' keys and
 * states (`bastion.runtime.durable` documents the format; `bastion.protocols.eventual`
 * the burst). A *run* is the items back to back, each a flags byte (0, or 1 when the
 * value holds a marked array: a tuple) and the value in msgpack, exactly as
 * `DurableCodec.pack` packs it alone. So a run is what ``b"".join(codec.pack_many(
 * values))`` gives, made here in one pass without a Python call per value.
 *
 * Only *plain* values are packed here: None, bool, exact int within 64 bits (signed or
 * unsigned, as msgpack takes it), exact float, str, bytes, and exact lists, tuples and
 * dicts of them. Anything else (a set, a big int, a subclass, a codec's type, a string
 * that is not valid UTF-8) makes the function return None, without an exception: the
 * caller then packs with the codec, which knows every type and refuses the rest with
 * the user's error. The bytes made here are the codec's, byte for byte (the tests
 * compare them); msgpack's own choices are kept: the narrowest int, a float always as
 * a float64, str8 for strings of 32-255 bytes, the dict's own order.
 *
 * A `durable.TableEnd` (registered by `set_table_end`) is packed as the dict of its
 * table's entries from entry ``start`` on, straight from the table: a delta's keys
 * appended since its parent, with no dict of them built and no entry before them read
 * (`bastion.runtime.incremental`).
 *
 * `split_run` cuts a run back into its items, each still packed, for the backward
 * pass, which names a part by its key's bytes: it walks the msgpack structure without
 * building a value, and refuses (None) any run that is not items back to back. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_compact_long.h"
#include <stdint.h>
#include <string.h>

/* msgpack refuses deeper nesting than its packer's limit (511); a value deeper than
 * this goes to the codec, which raises as it always did. */
#define MAX_DEPTH 500
/* the empty extension value of code 127 that opens a tuple's marked array */
static const unsigned char TUPLE_MARK[3] = {0xc7, 0x00, 0x7f};

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
    Py_ssize_t since_yield;  /* items packed since the GIL was last offered */
    /* When set, ``buf`` is this bytes object's own buffer, grown in place (a large
     * one by the allocator's realloc, which remaps pages rather than copying them):
     * a snapshot of 100 MB is then written once, not packed, copied into a bytes
     * object and copied again behind its header. */
    PyObject *bytes;
} Out;

/* A whole snapshot of millions of keys is packed in one call, which would hold the GIL
 * for a second or more: the worker's liveness thread could not answer the job
 * master's ping, and the worker would be taken for dead. So every YIELD_EVERY items
 * the GIL is offered to a thread that waits for it (a release and re-take: CPython
 * hands it over only when another thread asked). No Python code of this task runs
 * meanwhile; the task's state is only ever changed on the task's own thread. */
#define YIELD_EVERY 65536

static inline void
offer_gil(Out *o)
{
    if (++o->since_yield >= YIELD_EVERY) {
        o->since_yield = 0;
        Py_BEGIN_ALLOW_THREADS
        Py_END_ALLOW_THREADS
    }
}

static int
reserve(Out *o, Py_ssize_t extra)
{
    if (o->len + extra <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : 256;
    while (cap < o->len + extra)
        cap *= 2;
    if (o->bytes != NULL) {
        if (_PyBytes_Resize(&o->bytes, cap) < 0)
            return -1;  /* the object is freed and o->bytes NULL */
        o->buf = PyBytes_AS_STRING(o->bytes);
        o->cap = cap;
        return 0;
    }
    char *buf = PyMem_Realloc(o->buf, cap);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->buf = buf;
    o->cap = cap;
    return 0;
}

static inline void
put1(Out *o, unsigned char b)
{
    o->buf[o->len++] = (char)b;
}

static inline void
put_be(Out *o, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--)
        o->buf[o->len++] = (char)((v >> (8 * i)) & 0xff);
}

/* A header: ``fix | n`` below ``fix_limit``, else the 8-, 16- or 32-bit form (code 0
 * where the kind has none). Returns -1 on a memory error, 0 for a size msgpack cannot
 * hold (the value goes to the codec). */
static int
header(Out *o, uint64_t n, int fix, uint64_t fix_limit, int c8, int c16, int c32)
{
    if (reserve(o, 5) < 0)
        return -1;
    if (fix >= 0 && n < fix_limit)
        put1(o, (unsigned char)(fix | n));
    else if (c8 && n < 256) {
        put1(o, (unsigned char)c8);
        put_be(o, n, 1);
    }
    else if (n < 65536) {
        put1(o, (unsigned char)c16);
        put_be(o, n, 2);
    }
    else if (n <= 0xffffffffULL) {
        put1(o, (unsigned char)c32);
        put_be(o, n, 4);
    }
    else
        return 0;
    return 1;
}

static int
pack_uint(Out *o, uint64_t d)
{
    if (reserve(o, 9) < 0)
        return -1;
    if (d < 128)
        put1(o, (unsigned char)d);
    else if (d < 256) {
        put1(o, 0xcc);
        put_be(o, d, 1);
    }
    else if (d < 65536) {
        put1(o, 0xcd);
        put_be(o, d, 2);
    }
    else if (d <= 0xffffffffULL) {
        put1(o, 0xce);
        put_be(o, d, 4);
    }
    else {
        put1(o, 0xcf);
        put_be(o, d, 8);
    }
    return 1;
}

static int
pack_int(Out *o, long long d)
{
    if (d >= 0)
        return pack_uint(o, (uint64_t)d);
    if (reserve(o, 9) < 0)
        return -1;
    if (d >= -32)
        put1(o, (unsigned char)(d & 0xff));
    else if (d >= -128) {
        put1(o, 0xd0);
        put_be(o, (uint64_t)d, 1);
    }
    else if (d >= -32768) {
        put1(o, 0xd1);
        put_be(o, (uint64_t)d, 2);
    }
    else if (d >= -2147483648LL) {
        put1(o, 0xd2);
        put_be(o, (uint64_t)d, 4);
    }
    else {
        put1(o, 0xd3);
        put_be(o, (uint64_t)d, 8);
    }
    return 1;
}

static int
put_bytes(Out *o, const char *data, Py_ssize_t n)
{
    if (reserve(o, n) < 0)
        return -1;
    memcpy(o->buf + o->len, data, n);
    o->len += n;
    return 1;
}

static PyTypeObject *table_end_type;  /* durable.TableEnd, once registered */

static int pack_value(Out *o, PyObject *v, int depth, int *marked);

/* A TableEnd: a map of the entries of its ``table`` (an exact dict) from entry
 * ``start`` on, in the table's order. PyDict_Next's position is an index into the
 * table's entries, where a key is added at the end: the keys added since the table
 * held ``start`` keys all sit there (a superset if keys were removed before then, or
 * the entries compacted since: it also holds a few older keys, with their values
 * now). Its entries are counted first (the map's header), reading no key or value. */
static int
pack_table_end(Out *o, PyObject *v, int depth, int *marked)
{
    PyObject *table = PyObject_GetAttrString(v, "table");
    if (table == NULL)
        return -1;
    PyObject *start_obj = PyObject_GetAttrString(v, "start");
    if (start_obj == NULL) {
        Py_DECREF(table);
        return -1;
    }
    Py_ssize_t start = PyLong_AsSsize_t(start_obj);
    Py_DECREF(start_obj);
    int r = 0;
    if (start == -1 && PyErr_Occurred())
        r = -1;
    else if (PyDict_CheckExact(table) && start >= 0) {
        Py_ssize_t pos = start, n = 0;
        PyObject *key, *value;
        while (PyDict_Next(table, &pos, &key, &value))
            n++;
        r = header(o, (uint64_t)n, 0x80, 16, 0, 0xde, 0xdf);
        pos = start;
        while (r > 0 && PyDict_Next(table, &pos, &key, &value)) {
            if ((r = pack_value(o, key, depth + 1, marked)) > 0)
                r = pack_value(o, value, depth + 1, marked);
            offer_gil(o);
        }
    }
    Py_DECREF(table);  /* held while packing: offering the GIL runs no code of the task */
    return r;
}

/* 1: packed; 0: not a plain value (nothing raised, the caller gives up); -1: error.
 * Sets *marked when a tuple was packed. No user code runs: every type is exact. */
static int
pack_value(Out *o, PyObject *v, int depth, int *marked)
{
    PyTypeObject *type = Py_TYPE(v);
    int r;
    if (depth > MAX_DEPTH)
        return 0;
    if (v == Py_None || v == Py_True || v == Py_False) {
        if (reserve(o, 1) < 0)
            return -1;
        put1(o, v == Py_None ? 0xc0 : v == Py_True ? 0xc3 : 0xc2);
        return 1;
    }
    if (type == &PyLong_Type) {
        long long small;
        if (compact_long(v, &small))
            return pack_int(o, small);
        int overflow;
        long long d = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow > 0) {
            unsigned long long u = PyLong_AsUnsignedLongLong(v);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();  /* beyond 64 bits: the codec's extension value */
                return 0;
            }
            return pack_uint(o, u);
        }
        if (overflow < 0)
            return 0;
        if (d == -1 && PyErr_Occurred())
            return -1;
        return pack_int(o, d);
    }
    if (type == &PyFloat_Type) {
        double x = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &x, 8);
        if (reserve(o, 9) < 0)
            return -1;
        put1(o, 0xcb);
        put_be(o, bits, 8);
        return 1;
    }
    if (type == &PyUnicode_Type) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (s == NULL) {
            PyErr_Clear();   /* a lone surrogate: the codec says what is wrong */
            return 0;
        }
        if ((r = header(o, (uint64_t)n, 0xa0, 32, 0xd9, 0xda, 0xdb)) <= 0)
            return r;
        return put_bytes(o, s, n);
    }
    if (type == &PyBytes_Type) {
        Py_ssize_t n = PyBytes_GET_SIZE(v);
        if ((r = header(o, (uint64_t)n, -1, 0, 0xc4, 0xc5, 0xc6)) <= 0)
            return r;
        return put_bytes(o, PyBytes_AS_STRING(v), n);
    }
    if (type == &PyList_Type || type == &PyTuple_Type) {
        int tuple = type == &PyTuple_Type;
        Py_ssize_t n = Py_SIZE(v);
        PyObject **items = tuple ? ((PyTupleObject *)v)->ob_item
                                 : ((PyListObject *)v)->ob_item;
        if ((r = header(o, (uint64_t)(n + tuple), 0x90, 16, 0, 0xdc, 0xdd)) <= 0)
            return r;
        if (tuple) {
            if (put_bytes(o, (const char *)TUPLE_MARK, 3) < 0)
                return -1;
            *marked = 1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            if ((r = pack_value(o, items[i], depth + 1, marked)) <= 0)
                return r;
            offer_gil(o);
        }
        return 1;
    }
    if (type == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        if ((r = header(o, (uint64_t)PyDict_GET_SIZE(v), 0x80, 16, 0, 0xde, 0xdf)) <= 0)
            return r;
        while (PyDict_Next(v, &pos, &key, &value)) {
            if ((r = pack_value(o, key, depth + 1, marked)) <= 0)
                return r;
            if ((r = pack_value(o, value, depth + 1, marked)) <= 0)
                return r;
            offer_gil(o);
        }
        return 1;
    }
    if (type == table_end_type && table_end_type != NULL)
        return pack_table_end(o, v, depth, marked);
    return 0;
}

static PyObject *
finish(Out *o, int r)
{
    PyObject *out = NULL;
    if (r > 0)
        out = PyBytes_FromStringAndSize(o->buf, o->len);
    else if (r == 0) {
        out = Py_None;
        Py_INCREF(out);
    }
    PyMem_Free(o->buf);
    return out;
}

/* The sealed blob's header, as `durable.seal` writes it: magic (4 bytes), flags (1),
 * payload length (8, little-endian), then the CRC32 (4, little-endian) of those and
 * the payload. */
#define PREFIX_BYTES 13
#define HEADER_BYTES 17

static PyObject *crc32_func;  /* zlib.crc32: it releases the GIL over a large buffer */

/* zlib.crc32(data[:n], start) without copying ``data``. */
static int
crc32_of(const char *data, Py_ssize_t n, unsigned long start, unsigned long *crc)
{
    PyObject *view = PyMemoryView_FromMemory((char *)data, n, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *r = PyObject_CallFunction(crc32_func, "Ok", view, start);
    Py_DECREF(view);
    if (r == NULL)
        return -1;
    *crc = PyLong_AsUnsignedLong(r);
    Py_DECREF(r);
    return (*crc == (unsigned long)-1 && PyErr_Occurred()) ? -1 : 0;
}

/* seal(value, magic: bytes, marked_flag: int) -> bytes | None: the sealed blob
 * `DurableCodec.encode` makes of ``value`` — the header, then ``value`` in msgpack —
 * built in one buffer; None if ``value`` is not plain. A task's whole snapshot goes
 * through here. */
static PyObject *
seal(PyObject *module, PyObject *args)
{
    PyObject *value;
    const char *magic;
    Py_ssize_t magic_len;
    int marked_flag;
    if (!PyArg_ParseTuple(args, "Oy#i", &value, &magic, &magic_len, &marked_flag))
        return NULL;
    if (magic_len != 4) {
        PyErr_SetString(PyExc_ValueError, "seal takes a 4-byte magic");
        return NULL;
    }
    Out o = {NULL, 0, 0, 0, NULL};
    o.bytes = PyBytes_FromStringAndSize(NULL, 4096);
    if (o.bytes == NULL)
        return NULL;
    o.buf = PyBytes_AS_STRING(o.bytes);
    o.cap = 4096;
    o.len = HEADER_BYTES;
    int marked = 0;
    int r = pack_value(&o, value, 0, &marked);
    if (r <= 0) {
        Py_XDECREF(o.bytes);
        if (r < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    uint64_t length = (uint64_t)(o.len - HEADER_BYTES);
    unsigned char *h = (unsigned char *)o.buf;
    memcpy(h, magic, 4);
    h[4] = (unsigned char)(marked ? marked_flag : 0);
    for (int i = 0; i < 8; i++)
        h[5 + i] = (unsigned char)(length >> (8 * i));
    unsigned long crc;
    if (crc32_of(o.buf, PREFIX_BYTES, 0, &crc) < 0
            || crc32_of(o.buf + HEADER_BYTES, (Py_ssize_t)length, crc, &crc) < 0) {
        Py_DECREF(o.bytes);
        return NULL;
    }
    for (int i = 0; i < 4; i++)
        h[PREFIX_BYTES + i] = (unsigned char)(crc >> (8 * i));
    if (_PyBytes_Resize(&o.bytes, o.len) < 0)
        return NULL;
    return o.bytes;
}

/* pack_run(values: list) -> bytes | None: every value as `DurableCodec.pack` packs it,
 * back to back; None if one is not plain. */
static PyObject *
pack_run(PyObject *module, PyObject *values)
{
    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "pack_run takes a list");
        return NULL;
    }
    Out o = {NULL, 0, 0};
    int r = 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values) && r > 0; i++) {
        if (reserve(&o, 1) < 0) {
            r = -1;
            break;
        }
        Py_ssize_t flags_at = o.len;
        int marked = 0;
        put1(&o, 0);
        r = pack_value(&o, PyList_GET_ITEM(values, i), 0, &marked);
        o.buf[flags_at] = (char)marked;
    }
    return finish(&o, r);
}

/* pack_rows(parts: list, tables: tuple[dict, ...]) -> bytes | None: for every part the
 * list ``[table[part] for table in tables]`` packed as `pack_run` packs it: a batched
 * ``part_state`` of an operator whose part state is such a row (a time window's
 * accumulators and its latest stamp), without the row ever being built. None if a
 * part is missing from a table or a value is not plain. Looking a part up hashes and
 * compares it: a user type's __hash__ / __eq__ may run there, the only user code. */
static PyObject *
pack_rows(PyObject *module, PyObject *args)
{
    PyObject *parts, *tables;
    if (!PyArg_ParseTuple(args, "O!O!:pack_rows", &PyList_Type, &parts, &PyTuple_Type,
                          &tables))
        return NULL;
    Py_ssize_t width = PyTuple_GET_SIZE(tables);
    for (Py_ssize_t t = 0; t < width; t++) {
        if (!PyDict_CheckExact(PyTuple_GET_ITEM(tables, t))) {
            PyErr_SetString(PyExc_TypeError, "pack_rows takes a tuple of dicts");
            return NULL;
        }
    }
    Out o = {NULL, 0, 0};
    int r = 1;
    /* parts is a list the caller made and holds: a lookup's user code cannot free it */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(parts) && r > 0; i++) {
        PyObject *part = PyList_GET_ITEM(parts, i);
        Py_INCREF(part);
        if (reserve(&o, 1) < 0) {
            r = -1;
        }
        else {
            Py_ssize_t flags_at = o.len;
            int marked = 0;
            put1(&o, 0);
            r = header(&o, (uint64_t)width, 0x90, 16, 0, 0xdc, 0xdd);
            for (Py_ssize_t t = 0; t < width && r > 0; t++) {
                PyObject *value = PyDict_GetItemWithError(PyTuple_GET_ITEM(tables, t), part);
                if (value == NULL)
                    r = PyErr_Occurred() ? -1 : 0;
                else {
                    Py_INCREF(value);
                    r = pack_value(&o, value, 1, &marked);
                    Py_DECREF(value);
                }
            }
            if (r > 0)
                o.buf[flags_at] = (char)marked;
        }
        Py_DECREF(part);
    }
    return finish(&o, r);
}

/* Past one msgpack object at data[*pos]; 0 if the bytes end first or are not
 * msgpack. Iterative: ``pending`` counts the objects still to pass, so no nesting
 * depth can exhaust the stack, and a header that promises more objects than bytes
 * remain fails at once. */
static int
skip_object(const unsigned char *data, Py_ssize_t n, Py_ssize_t *pos)
{
    uint64_t pending = 1;
    Py_ssize_t p = *pos;
    while (pending) {
        if (p >= n || pending > (uint64_t)(n - p))
            return 0;
        unsigned char b = data[p++];
        pending--;
        uint64_t len = 0, items = 0;
        int size_bytes = 0;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
            continue;
        if (b >= 0x80 && b <= 0x8f) {
            pending += 2 * (uint64_t)(b & 0x0f);
            continue;
        }
        if (b >= 0x90 && b <= 0x9f) {
            pending += b & 0x0f;
            continue;
        }
        if (b >= 0xa0 && b <= 0xbf) {
            len = b & 0x1f;
        }
        else {
            switch (b) {
            case 0xc4: case 0xd9: size_bytes = 1; break;   /* bin8, str8 */
            case 0xc5: case 0xda: size_bytes = 2; break;
            case 0xc6: case 0xdb: size_bytes = 4; break;
            case 0xc7: size_bytes = 1; len = 1; break;     /* ext: size, then the code */
            case 0xc8: size_bytes = 2; len = 1; break;
            case 0xc9: size_bytes = 4; len = 1; break;
            case 0xca: len = 4; break;
            case 0xcb: len = 8; break;
            case 0xcc: case 0xd0: len = 1; break;
            case 0xcd: case 0xd1: len = 2; break;
            case 0xce: case 0xd2: len = 4; break;
            case 0xcf: case 0xd3: len = 8; break;
            case 0xd4: len = 2; break;                     /* fixext: code + data */
            case 0xd5: len = 3; break;
            case 0xd6: len = 5; break;
            case 0xd7: len = 9; break;
            case 0xd8: len = 17; break;
            case 0xdc: size_bytes = 2; items = 1; break;
            case 0xdd: size_bytes = 4; items = 1; break;
            case 0xde: size_bytes = 2; items = 2; break;
            case 0xdf: size_bytes = 4; items = 2; break;
            default: return 0;                              /* 0xc1: never used */
            }
        }
        if (size_bytes) {
            if (n - p < size_bytes)
                return 0;
            uint64_t size = 0;
            for (int i = 0; i < size_bytes; i++)
                size = (size << 8) | data[p++];
            if (items) {
                pending += items * size;
                continue;
            }
            len += size;
        }
        if ((uint64_t)(n - p) < len)
            return 0;
        p += (Py_ssize_t)len;
    }
    *pos = p;
    return 1;
}

/* split_run(data: bytes) -> tuple[bytes, ...] | None: the items of a run, each its
 * flags byte and its value's bytes; None unless ``data`` is one or more items, each a
 * flags byte 0 or 1 and one whole msgpack object, with nothing after the last. */
static PyObject *
split_run(PyObject *module, PyObject *arg)
{
    if (!PyBytes_CheckExact(arg)) {
        PyErr_SetString(PyExc_TypeError, "split_run takes bytes");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg), pos = 0;
    PyObject *items = PyList_New(0);
    if (items == NULL)
        return NULL;
    while (pos < n) {
        Py_ssize_t start = pos;
        if (data[pos] > 1)
            goto refused;
        pos++;
        if (!skip_object(data, n, &pos))
            goto refused;
        PyObject *item = PyBytes_FromStringAndSize((const char *)data + start, pos - start);
        if (item == NULL || PyList_Append(items, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(items);
            return NULL;
        }
        Py_DECREF(item);
    }
    if (PyList_GET_SIZE(items) == 0)
        goto refused;
    PyObject *out = PyList_AsTuple(items);
    Py_DECREF(items);
    return out;
refused:
    Py_DECREF(items);
    Py_RETURN_NONE;
}

/* set_table_end(cls): the class `seal` packs as a table's end (durable.TableEnd). */
static PyObject *
set_table_end(PyObject *module, PyObject *cls)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "set_table_end takes a class");
        return NULL;
    }
    Py_INCREF(cls);
    Py_XDECREF(table_end_type);
    table_end_type = (PyTypeObject *)cls;
    Py_RETURN_NONE;
}

/* int_range(values: list) -> tuple[int, int] | None: (first, count) when ``values``
 * are two or more exact ints within 64 bits, each one more than the one before (the
 * window numbers a batch opens or a watermark closes); else None. */
static PyObject *
int_range(PyObject *module, PyObject *values)
{
    if (!PyList_Check(values)) {
        PyErr_SetString(PyExc_TypeError, "int_range takes a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (n < 2)
        Py_RETURN_NONE;
    long long first = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(values, i);
        if (!PyLong_CheckExact(item))
            Py_RETURN_NONE;
        int overflow = 0;
        long long value = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow || (value == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        if (i == 0)
            first = value;
        else if (first > LLONG_MAX - i || value != first + i)
            Py_RETURN_NONE;
    }
    return Py_BuildValue("(Ln)", first, n);
}

static PyMethodDef methods[] = {
    {"seal", seal, METH_VARARGS, "a plain value's sealed blob, or None"},
    {"pack_run", pack_run, METH_O, "plain values packed back to back, or None"},
    {"pack_rows", pack_rows, METH_VARARGS,
     "a row of table lookups per part, packed back to back, or None"},
    {"split_run", split_run, METH_O, "the packed items of a run, or None"},
    {"int_range", int_range, METH_O, "(first, count) of consecutive ints, or None"},
    {"set_table_end", set_table_end, METH_O, "the class packed as a table's end"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bastion.runtime._durable",
    "Packed runs of durable values (see bastion.runtime.durable).", -1, methods,
};

PyMODINIT_FUNC
PyInit__durable(void)
{
    PyObject *zlib = PyImport_ImportModule("zlib");
    if (zlib == NULL)
        return NULL;
    crc32_func = PyObject_GetAttrString(zlib, "crc32");
    Py_DECREF(zlib);
    if (crc32_func == NULL)
        return NULL;
    return PyModule_Create(&module);
}
