/* The log writer's per-record loop in C: records framed as `bastion.storage.log`
 * stores them, a header (payload length, CRC-32 of the payload; two little-endian
 * u32) before the msgpack of [seq, ts, value]. The pure-Python loop in
 * `LogWriter.append_many` is the reference: this produces the same bytes (the tests
 * check it), it only avoids one interpreter round trip per record, which is most of
 * what a small record costs to append. Sequence numbers, float or small-int event
 * times and bytes values are encoded here; every other ts or value goes through the
 * writer's own msgpack packer, so the encoding is msgpack's whatever the type. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* CRC-32 (zlib's: the same polynomial, initial value and final xor), eight bytes
 * per step with eight tables ("slicing-by-8"): a record's CRC is a fair share of
 * framing it, and a byte-at-a-time table would cost more than the loop it replaces. */
static uint32_t crc_tables[8][256];

static void
crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_tables[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_tables[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_tables[0][c & 0xFF] ^ (c >> 8);
            crc_tables[k][n] = c;
        }
    }
}

static uint32_t
load_le32(const unsigned char *at)
{
    return (uint32_t)at[0] | ((uint32_t)at[1] << 8) | ((uint32_t)at[2] << 16)
           | ((uint32_t)at[3] << 24);
}

static uint32_t
crc32_of(const unsigned char *data, Py_ssize_t size)
{
    uint32_t c = 0xFFFFFFFFu;
    while (size >= 8) {
        uint32_t one = load_le32(data) ^ c, two = load_le32(data + 4);
        c = crc_tables[7][one & 0xFF] ^ crc_tables[6][(one >> 8) & 0xFF]
            ^ crc_tables[5][(one >> 16) & 0xFF] ^ crc_tables[4][one >> 24]
            ^ crc_tables[3][two & 0xFF] ^ crc_tables[2][(two >> 8) & 0xFF]
            ^ crc_tables[1][(two >> 16) & 0xFF] ^ crc_tables[0][two >> 24];
        data += 8;
        size -= 8;
    }
    while (size-- > 0)
        c = crc_tables[0][(c ^ *data++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

typedef struct {
    unsigned char *data;
    Py_ssize_t size, capacity;
} Buffer;

static int
reserve(Buffer *buf, Py_ssize_t more)
{
    if (buf->size + more <= buf->capacity)
        return 0;
    Py_ssize_t capacity = buf->capacity * 2;
    if (capacity < buf->size + more)
        capacity = buf->size + more;
    unsigned char *data = PyMem_Realloc(buf->data, capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    buf->data = data;
    buf->capacity = capacity;
    return 0;
}

static void
put_be(unsigned char *at, uint64_t value, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--) {
        at[i] = (unsigned char)(value & 0xFF);
        value >>= 8;
    }
}

/* msgpack of a non-negative int, in the shortest form (as msgpack's packer does). */
static int
put_uint(Buffer *buf, uint64_t value)
{
    if (reserve(buf, 9) < 0)
        return -1;
    unsigned char *at = buf->data + buf->size;
    if (value < 128) {
        at[0] = (unsigned char)value;
        buf->size += 1;
    } else if (value <= 0xFF) {
        at[0] = 0xcc;
        at[1] = (unsigned char)value;
        buf->size += 2;
    } else if (value <= 0xFFFF) {
        at[0] = 0xcd;
        put_be(at + 1, value, 2);
        buf->size += 3;
    } else if (value <= 0xFFFFFFFFu) {
        at[0] = 0xce;
        put_be(at + 1, value, 4);
        buf->size += 5;
    } else {
        at[0] = 0xcf;
        put_be(at + 1, value, 8);
        buf->size += 9;
    }
    return 0;
}

static int
put_packed(Buffer *buf, PyObject *pack, PyObject *item)
{
    PyObject *packed = PyObject_CallOneArg(pack, item);
    if (packed == NULL)
        return -1;
    if (!PyBytes_Check(packed)) {
        Py_DECREF(packed);
        PyErr_SetString(PyExc_TypeError, "pack must return bytes");
        return -1;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(packed);
    if (reserve(buf, size) < 0) {
        Py_DECREF(packed);
        return -1;
    }
    memcpy(buf->data + buf->size, PyBytes_AS_STRING(packed), size);
    buf->size += size;
    Py_DECREF(packed);
    return 0;
}

static int
put_item(Buffer *buf, PyObject *pack, PyObject *item)
{
    if (PyFloat_CheckExact(item)) {
        if (reserve(buf, 9) < 0)
            return -1;
        double value = PyFloat_AS_DOUBLE(item);
        uint64_t bits;
        memcpy(&bits, &value, 8);
        buf->data[buf->size] = 0xcb;
        put_be(buf->data + buf->size + 1, bits, 8);
        buf->size += 9;
        return 0;
    }
    if (PyLong_CheckExact(item)) {
        int overflow = 0;
        long long value = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (!overflow && value >= 0)
            return put_uint(buf, (uint64_t)value);
        if (value == -1 && PyErr_Occurred())
            return -1;
        return put_packed(buf, pack, item);  /* negative or wide: msgpack's forms */
    }
    if (PyBytes_CheckExact(item)) {
        Py_ssize_t size = PyBytes_GET_SIZE(item);
        if (size > 0xFFFFFFFFLL)
            return put_packed(buf, pack, item);  /* msgpack refuses it, with its error */
        if (reserve(buf, 5 + size) < 0)
            return -1;
        unsigned char *at = buf->data + buf->size;
        if (size <= 0xFF) {
            at[0] = 0xc4;
            at[1] = (unsigned char)size;
            buf->size += 2;
        } else if (size <= 0xFFFF) {
            at[0] = 0xc5;
            put_be(at + 1, (uint64_t)size, 2);
            buf->size += 3;
        } else {
            at[0] = 0xc6;
            put_be(at + 1, (uint64_t)size, 4);
            buf->size += 5;
        }
        memcpy(buf->data + buf->size, PyBytes_AS_STRING(item), size);
        buf->size += size;
        return 0;
    }
    return put_packed(buf, pack, item);
}

/* frame_records(first_seq, records, pack) -> bytes: every (ts, value) pair of the
 * list `records` framed with seq first_seq, first_seq + 1, ...; `pack` is the
 * writer's msgpack packer's pack (use_bin_type=True) for what is not encoded here.
 * None if an item is not a 2-tuple: the Python loop takes any (ts, value) pair. */
static PyObject *
frame_records(PyObject *module, PyObject *args)
{
    long long first_seq;
    PyObject *records, *pack;
    if (!PyArg_ParseTuple(args, "LO!O:frame_records", &first_seq, &PyList_Type, &records,
                          &pack))
        return NULL;
    if (first_seq < 0) {
        PyErr_SetString(PyExc_ValueError, "first_seq must not be negative");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(records);
    Buffer buf = {NULL, 0, 0};
    if (reserve(&buf, count * 64 + 64) < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        if (!PyTuple_CheckExact(record) || PyTuple_GET_SIZE(record) != 2) {
            PyMem_Free(buf.data);  /* not a pair: the caller's Python loop frames it */
            Py_RETURN_NONE;
        }
        Py_ssize_t header_at = buf.size;
        if (reserve(&buf, 9) < 0)
            goto fail;
        buf.size += 8;                  /* the header, written once the payload is */
        buf.data[buf.size++] = 0x93;    /* fixarray of 3 */
        if (put_uint(&buf, (uint64_t)(first_seq + i)) < 0
                || put_item(&buf, pack, PyTuple_GET_ITEM(record, 0)) < 0
                || put_item(&buf, pack, PyTuple_GET_ITEM(record, 1)) < 0)
            goto fail;
        Py_ssize_t payload = buf.size - header_at - 8;
        if (payload > 0xFFFFFFFFLL) {
            PyErr_SetString(PyExc_ValueError, "a log record must be under 4 GiB");
            goto fail;
        }
        uint32_t crc = crc32_of(buf.data + header_at + 8, payload);
        unsigned char *at = buf.data + header_at;
        for (int k = 0; k < 4; k++) {
            at[k] = (unsigned char)(((uint32_t)payload >> (8 * k)) & 0xFF);
            at[4 + k] = (unsigned char)((crc >> (8 * k)) & 0xFF);
        }
    }
    PyObject *out = PyBytes_FromStringAndSize((const char *)buf.data, buf.size);
    PyMem_Free(buf.data);
    return out;
fail:
    PyMem_Free(buf.data);
    return NULL;
}

static PyMethodDef methods[] = {
    {"frame_records", frame_records, METH_VARARGS,
     "(ts, value) records framed for the log, seq from first_seq"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bastion.storage._logframe",
    "The log writer's record framing (see bastion.storage.log).", -1, methods,
};

PyMODINIT_FUNC
PyInit__logframe(void)
{
    crc_init();
    return PyModule_Create(&module);
}
