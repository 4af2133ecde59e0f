/* common.speedups: native versions of the store's per-message loops.
 *
 * Every function here has a pure-Python reference in store/ (the module that imports it says
 * which); the Python code picks these only when this module imports and TRIMQ_NO_NATIVE is not
 * set. Exception classes and helpers that live in Python modules are passed in as arguments, so
 * the module holds no state besides the CRC table (computed once at import, never written
 * again). Two types hold state of their own: `FsyncWorker` (Linux), the group commit's fsync
 * thread (its Python counterpart is store._flush._FsyncThread), and `UniqKeys`, the state of
 * common.message.UniqKeyGenerator.
 *
 * Byte order: every record field is big-endian (RocketMQ's format).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <structmember.h>
#include <string.h>

/* ------------------------------------------------------------------ helpers */

static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void put_be16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static inline void put_be64(unsigned char *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static inline uint32_t get_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline uint16_t get_be16(const unsigned char *p) {
    return (uint16_t)(((unsigned)p[0] << 8) | (unsigned)p[1]);
}

/* An int (or __index__ object) within [lo, hi]; else `err` (NULL: OverflowError / TypeError as
 * Python raises them) with a message naming `what`. Returns -1 with an exception set. */
static int get_ll(PyObject *obj, long long lo, long long hi, long long *out, PyObject *err,
                  const char *what) {
    PyObject *num = PyNumber_Index(obj);
    if (num == NULL) {
        if (err != NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(err, "field out of range: %s is not an integer", what);
        }
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(num, &overflow);
    Py_DECREF(num);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < lo || v > hi) {
        PyErr_Format(err != NULL ? err : PyExc_OverflowError,
                     "field out of range: %s must be in [%lld, %lld]", what, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* A writable buffer; TypeError (as struct.pack_into raises) for a read-only object. */
static int get_writable(PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) == 0) return 0;
    if (PyErr_ExceptionMatches(PyExc_BufferError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "argument must be read-write bytes-like object, not %.100s",
                     Py_TYPE(obj)->tp_name);
    }
    return -1;
}

/* Replace the pending OverflowError / TypeError / ValueError by struct.error with the same
 * message: what struct.pack / pack_into raise for the same input in the Python reference. */
static void as_struct_error(void) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError) && !PyErr_ExceptionMatches(PyExc_TypeError) &&
        !PyErr_ExceptionMatches(PyExc_ValueError))
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *mod = PyImport_ImportModule("struct");
    PyObject *err = mod != NULL ? PyObject_GetAttrString(mod, "error") : NULL;
    Py_XDECREF(mod);
    if (err == NULL) { /* keep the original error */
        PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return;
    }
    PyObject *msg = value != NULL ? PyObject_Str(value) : NULL;
    if (msg == NULL) PyErr_Clear();
    PyErr_SetObject(err, msg != NULL ? msg : Py_None);
    Py_XDECREF(msg);
    Py_DECREF(err);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

#define I32_MIN (-2147483647LL - 1)
#define I32_MAX 2147483647LL
#define I64_MIN (-9223372036854775807LL - 1)
#define I64_MAX 9223372036854775807LL

/* ------------------------------------------------------------------ CRC32 (IEEE, zlib's) */

static uint32_t crc_table[8][256]; /* filled once in PyInit, read-only afterwards */

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

/* Slicing-by-8 over little-endian loads (x86 / arm64 Linux). */
static uint32_t crc32_ieee(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if PY_BIG_ENDIAN
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= crc;
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
              crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
              crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_CLMUL_CRC 1
static int use_clmul; /* set once in PyInit from the CPU's feature bits, read-only afterwards */

/* CRC folding with carry-less multiplication (Intel's "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ", bit-reflected constants of the IEEE polynomial). `crc` is the
 * pre-inverted running value; `len` >= 64 and a multiple of 16. Returns the pre-inverted value.
 */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_clmul(uint32_t crc,
                                                                      const unsigned char *p,
                                                                      size_t len) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;

    x1 = _mm_loadu_si128((const __m128i *)(p + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(p + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(p + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(p + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    p += 64;
    len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, k1k2, 0x00);
        x6 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        x7 = _mm_clmulepi64_si128(x3, k1k2, 0x00);
        x8 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(p + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(p + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(p + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(p + 0x30)));
        p += 64;
        len -= 64;
    }
    /* fold the four lanes into one */
    x0 = k3k4;
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)p);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        p += 16;
        len -= 16;
    }
    /* 128 -> 64 bits */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_clmulepi64_si128(x1, k5k0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to 32 bits */
    x2 = _mm_and_si128(x1, mask32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x10);
    x2 = _mm_and_si128(x2, mask32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

/* zlib.crc32(data, crc): the folding kernel for the bulk when the CPU has it, tables else. */
static uint32_t crc32_any(uint32_t crc, const unsigned char *p, size_t n) {
#ifdef HAVE_CLMUL_CRC
    if (use_clmul && n >= 64) {
        size_t bulk = n & ~(size_t)15;
        crc = ~crc32_clmul(~crc, p, bulk);
        p += bulk;
        n -= bulk;
    }
#endif
    return n ? crc32_ieee(crc, p, n) : crc;
}

static PyObject *sp_crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0)");
        return NULL;
    }
    uint32_t start = 0;
    if (nargs == 2) {
        unsigned long v = PyLong_AsUnsignedLongMask(args[1]);
        if (v == (unsigned long)-1 && PyErr_Occurred()) return NULL;
        start = (uint32_t)v;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c;
    if (view.len > 4096) {
        Py_BEGIN_ALLOW_THREADS c = crc32_any(start, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        c = crc32_any(start, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* ------------------------------------------------------------------ Java String.hashCode */

/* h = 31*h + unit over the UTF-16 code units of `s`, continuing from `h`. */
static uint32_t java_hash_cont(uint32_t h, PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *d = data;
        for (Py_ssize_t i = 0; i < n; i++) h = 31u * h + d[i];
    } else if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *d = data;
        for (Py_ssize_t i = 0; i < n; i++) h = 31u * h + d[i];
    } else {
        const Py_UCS4 *d = data;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = d[i];
            if (c >= 0x10000) {
                c -= 0x10000;
                h = 31u * h + (0xD800u + (c >> 10));
                h = 31u * h + (0xDC00u + (c & 0x3FF));
            } else {
                h = 31u * h + c;
            }
        }
    }
    return h;
}

/* abs() of the int32 hash as RocketMQ's index stores it (Integer.MIN_VALUE -> 0). */
static inline int32_t abs32(uint32_t h) {
    int32_t v = (int32_t)h;
    if (v < 0) v = (v == INT32_MIN) ? 0 : -v;
    return v;
}

static PyObject *sp_java_string_hash(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "java_string_hash() needs a str, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    if (PyUnicode_READY(arg) < 0) return NULL;
    return PyLong_FromLong((long)(int32_t)java_hash_cont(0, arg));
}

/* key_hash(prefix + key) without building the string. */
static PyObject *sp_key_hash2(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "key_hash2(prefix: str, key: str)");
        return NULL;
    }
    if (PyUnicode_READY(args[0]) < 0 || PyUnicode_READY(args[1]) < 0) return NULL;
    uint32_t h = java_hash_cont(java_hash_cont(0, args[0]), args[1]);
    return PyLong_FromLong((long)abs32(h));
}

/* ------------------------------------------------------------------ properties */

static PyObject *decode_props_into(PyObject *dict, PyObject *text) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t start = 0;
    while (start <= n) {
        /* segment [start, end) */
        Py_ssize_t end = start;
        Py_ssize_t sep = -1;
        while (end < n) {
            Py_UCS4 c = PyUnicode_READ(kind, data, end);
            if (c == 2) break;
            if (c == 1 && sep < 0) sep = end;
            end++;
        }
        if (sep > start && sep + 1 < end) {
            PyObject *name = PyUnicode_Substring(text, start, sep);
            if (name == NULL) return NULL;
            PyObject *value = PyUnicode_Substring(text, sep + 1, end);
            if (value == NULL) {
                Py_DECREF(name);
                return NULL;
            }
            int rc = PyDict_SetItem(dict, name, value);
            Py_DECREF(name);
            Py_DECREF(value);
            if (rc < 0) return NULL;
        }
        start = end + 1;
    }
    return dict;
}

static PyObject *sp_decode_properties(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "decode_properties() needs a str, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    if (PyUnicode_READY(arg) < 0) return NULL;
    PyObject *dict = PyDict_New();
    if (dict == NULL) return NULL;
    if (PyUnicode_GET_LENGTH(arg) == 0) return dict;
    if (decode_props_into(dict, arg) == NULL) {
        Py_DECREF(dict);
        return NULL;
    }
    return dict;
}

/* ------------------------------------------------------------------ interned names */

static PyObject *s_topic, *s_body, *s_queue_id, *s_flag, *s_properties, *s_properties_string,
    *s_sys_flag, *s_born_timestamp, *s_born_host, *s_store_host, *s_reconsume_times,
    *s_prepared_transaction_offset, *s_tags_code, *s_encoded_properties, *s_TAGS, *s_WAIT, *s_KEYS,
    *s_UNIQ_KEY;

static int intern_names(void) {
#define INTERN(var, text)                                                                          \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return -1;
    INTERN(s_topic, "topic")
    INTERN(s_body, "body")
    INTERN(s_queue_id, "queue_id")
    INTERN(s_flag, "flag")
    INTERN(s_properties, "properties")
    INTERN(s_properties_string, "properties_string")
    INTERN(s_sys_flag, "sys_flag")
    INTERN(s_born_timestamp, "born_timestamp")
    INTERN(s_born_host, "born_host")
    INTERN(s_store_host, "store_host")
    INTERN(s_reconsume_times, "reconsume_times")
    INTERN(s_prepared_transaction_offset, "prepared_transaction_offset")
    INTERN(s_tags_code, "tags_code")
    INTERN(s_encoded_properties, "encoded_properties")
    INTERN(s_TAGS, "TAGS")
    INTERN(s_WAIT, "WAIT")
    INTERN(s_KEYS, "KEYS")
    INTERN(s_UNIQ_KEY, "UNIQ_KEY")
#undef INTERN
    return 0;
}

/* ------------------------------------------------------------------ MessageInner slots */

/* MessageInner's attributes. When a type keeps each of them in a plain object slot (its
 * __slots__), they are read and written at the slot's offset, found per call through the
 * type's member descriptors; anything else (a property, a __dict__ attribute) goes through
 * getattr / setattr. */
enum {
    F_TOPIC,
    F_BODY,
    F_QUEUE_ID,
    F_FLAG,
    F_PROPERTIES,
    F_PROPERTIES_STRING,
    F_SYS_FLAG,
    F_BORN_TS,
    F_BORN_HOST,
    F_STORE_HOST,
    F_RECONSUME,
    F_PREPARED,
    F_TAGS_CODE,
    N_FIELDS
};

static PyObject **const field_names[N_FIELDS] = {
    &s_topic,          &s_body,           &s_queue_id,          &s_flag,
    &s_properties,     &s_properties_string, &s_sys_flag,       &s_born_timestamp,
    &s_born_host,      &s_store_host,     &s_reconsume_times,   &s_prepared_transaction_offset,
    &s_tags_code,
};

typedef struct {
    PyTypeObject *type; /* borrowed: the objects of that type are alive during the call */
    int fast;
    Py_ssize_t off[N_FIELDS];
} fields_t;

/* Offset of `tp`'s attribute `name` when it is a plain, writable object slot (a __slots__
 * entry); 0 when it is anything else (a property, a __dict__ attribute, a read-only member). */
static Py_ssize_t plain_slot_offset(PyTypeObject *tp, PyObject *name) {
    PyObject *d = _PyType_Lookup(tp, name);
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) return 0;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0 ||
        (size_t)m->offset + sizeof(PyObject *) > (size_t)tp->tp_basicsize)
        return 0;
    return m->offset;
}

static void fields_for(fields_t *f, PyTypeObject *tp) {
    f->type = tp;
    f->fast = 0;
    for (int i = 0; i < N_FIELDS; i++)
        if ((f->off[i] = plain_slot_offset(tp, *field_names[i])) == 0) return;
    f->fast = 1;
}

/* New reference to obj.<field>. */
static PyObject *get_field(fields_t *f, PyObject *obj, int i) {
    if (Py_TYPE(obj) != f->type) fields_for(f, Py_TYPE(obj));
    if (!f->fast) return PyObject_GetAttr(obj, *field_names[i]);
    PyObject *v = *(PyObject **)((char *)obj + f->off[i]);
    if (v == NULL) {
        PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute '%U'",
                     Py_TYPE(obj)->tp_name, *field_names[i]);
        return NULL;
    }
    return Py_NewRef(v);
}

/* obj.<field> = value (a new object of f->type: its slots are empty). */
static int set_field(fields_t *f, PyObject *obj, int i, PyObject *value) {
    if (!f->fast || Py_TYPE(obj) != f->type) return PyObject_SetAttr(obj, *field_names[i], value);
    PyObject **slot = (PyObject **)((char *)obj + f->off[i]);
    PyObject *old = *slot;
    *slot = Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
}

/* ------------------------------------------------------------------ encode_records */

#define MESSAGE_MAGIC_CODE 0xDAA320A7u
#define BORNHOST_V6_FLAG 0x10
#define STOREHOST_V6_FLAG 0x20
#define HOST_MASK (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)
#define MAX_TOPIC_SIZE 127
#define MAX_PROPERTIES_SIZE 32767

/* A required int attribute as a long long within [lo, hi] (MessageEncodeError otherwise). */
static int attr_ll(fields_t *f, PyObject *obj, int field, long long lo, long long hi,
                   long long *out, PyObject *err) {
    PyObject *v = get_field(f, obj, field);
    if (v == NULL) return -1;
    int rc = get_ll(v, lo, hi, out, err, PyUnicode_AsUTF8(*field_names[field]));
    Py_DECREF(v);
    return rc;
}

/* (ip bytes, port) of a host tuple via the Python `pack_ip` (cached there). */
static PyObject *host_ip(PyObject *host, PyObject *pack_ip, PyObject *err) {
    PyObject *ip = PySequence_GetItem(host, 0);
    if (ip == NULL) return NULL;
    PyObject *raw = PyObject_CallOneArg(pack_ip, ip);
    Py_DECREF(ip);
    if (raw == NULL) return NULL;
    if (!PyBytes_Check(raw) || (PyBytes_GET_SIZE(raw) != 4 && PyBytes_GET_SIZE(raw) != 16)) {
        Py_DECREF(raw);
        PyErr_SetString(err, "pack_ip must return 4 or 16 bytes");
        return NULL;
    }
    return raw;
}

static int host_port(PyObject *host, PyObject *err, const char *what, long long *out) {
    PyObject *port = PySequence_GetItem(host, 1);
    if (port == NULL) return -1;
    int rc = get_ll(port, I32_MIN, I32_MAX, out, err, what);
    Py_DECREF(port);
    return rc;
}

/*
 * encode_records(msgs, pack_ip, encode_error, size_error)
 *   -> (bytearray, sizes, ts_positions | None, store_host | None)
 * The fields of `common.message.EncodedRecords`; queue offset, physical offset and store
 * timestamp are left 0.
 */
static PyObject *sp_encode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_records(msgs, pack_ip, encode_error, size_error)");
        return NULL;
    }
    PyObject *pack_ip = args[1], *enc_err = args[2], *size_err = args[3];
    PyObject *seq = PySequence_Tuple(args[0]);
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *buf = PyByteArray_FromStringAndSize(NULL, 0);
    PyObject *sizes = PyList_New(0);
    PyObject *ts_positions = NULL; /* list, once a v6 born host appears */
    PyObject *last_topic = NULL, *topic_b = NULL;
    PyObject *last_born = NULL, *last_store = NULL, *last_sys = NULL;
    PyObject *born_raw = NULL, *store_raw = NULL;
    long long born_port = 0, store_port = 0, sys_flag = 0;
    int same_store = 1;
    PyObject *result = NULL;
    fields_t fl;
    fl.type = NULL;
    fl.fast = 0;
    if (buf == NULL || sizes == NULL) goto done;

    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *msg = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *topic = get_field(&fl, msg, F_TOPIC);
        if (topic == NULL) goto done;
        if (topic != last_topic) {
            int eq = last_topic != NULL ? PyObject_RichCompareBool(topic, last_topic, Py_EQ) : 0;
            if (eq < 0) {
                Py_DECREF(topic);
                goto done;
            }
            if (!eq) {
                if (!PyUnicode_Check(topic)) {
                    PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute 'encode'",
                                 Py_TYPE(topic)->tp_name);
                    Py_DECREF(topic);
                    goto done;
                }
                PyObject *tb = PyUnicode_AsUTF8String(topic);
                if (tb == NULL) {
                    Py_DECREF(topic);
                    goto done;
                }
                if (PyBytes_GET_SIZE(tb) > MAX_TOPIC_SIZE) {
                    PyErr_Format(enc_err, "topic is %zd bytes, V1 records allow 127",
                                 PyBytes_GET_SIZE(tb));
                    Py_DECREF(tb);
                    Py_DECREF(topic);
                    goto done;
                }
                Py_XSETREF(topic_b, tb);
            }
            Py_XSETREF(last_topic, topic);
        } else {
            Py_DECREF(topic);
        }

        PyObject *props_s = get_field(&fl, msg, F_PROPERTIES_STRING);
        if (props_s == NULL) goto done;
        if (props_s == Py_None) {
            Py_DECREF(props_s);
            props_s = PyObject_CallMethodNoArgs(msg, s_encoded_properties);
            if (props_s == NULL) goto done;
        }
        if (!PyUnicode_Check(props_s)) {
            PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute 'encode'",
                         Py_TYPE(props_s)->tp_name);
            Py_DECREF(props_s);
            goto done;
        }
        Py_ssize_t props_len;
        const char *props_c = PyUnicode_AsUTF8AndSize(props_s, &props_len);
        if (props_c == NULL) {
            Py_DECREF(props_s);
            goto done;
        }
        if (props_len > MAX_PROPERTIES_SIZE) {
            PyErr_Format(size_err, "properties are %zd bytes, the limit is %d", props_len,
                         MAX_PROPERTIES_SIZE);
            Py_DECREF(props_s);
            goto done;
        }

        PyObject *born = get_field(&fl, msg, F_BORN_HOST);
        PyObject *store = born != NULL ? get_field(&fl, msg, F_STORE_HOST) : NULL;
        PyObject *msys = store != NULL ? get_field(&fl, msg, F_SYS_FLAG) : NULL;
        if (msys == NULL) {
            Py_XDECREF(born);
            Py_XDECREF(store);
            Py_DECREF(props_s);
            goto done;
        }
        int changed = last_born == NULL;
        if (!changed) {
            int eq = PyObject_RichCompareBool(born, last_born, Py_EQ);
            if (eq > 0) eq = PyObject_RichCompareBool(store, last_store, Py_EQ);
            if (eq > 0) eq = PyObject_RichCompareBool(msys, last_sys, Py_EQ);
            if (eq < 0) {
                Py_DECREF(born);
                Py_DECREF(store);
                Py_DECREF(msys);
                Py_DECREF(props_s);
                goto done;
            }
            changed = !eq;
        }
        if (changed) {
            if (last_store != NULL) {
                int eq = PyObject_RichCompareBool(store, last_store, Py_EQ);
                if (eq < 0) {
                    Py_DECREF(born);
                    Py_DECREF(store);
                    Py_DECREF(msys);
                    Py_DECREF(props_s);
                    goto done;
                }
                if (!eq) same_store = 0;
            }
            Py_XSETREF(last_born, born);
            Py_XSETREF(last_store, store);
            Py_XSETREF(last_sys, msys);
            Py_CLEAR(born_raw);
            Py_CLEAR(store_raw);
            born_raw = host_ip(last_born, pack_ip, enc_err);
            if (born_raw == NULL) {
                Py_DECREF(props_s);
                goto done;
            }
            store_raw = host_ip(last_store, pack_ip, enc_err);
            if (store_raw == NULL) {
                Py_DECREF(props_s);
                goto done;
            }
            long long sf;
            if (get_ll(last_sys, I64_MIN, I64_MAX, &sf, enc_err, "sys_flag") < 0) {
                Py_DECREF(props_s);
                goto done;
            }
            sf &= ~(long long)HOST_MASK;
            if (PyBytes_GET_SIZE(born_raw) == 16) sf |= BORNHOST_V6_FLAG;
            if (PyBytes_GET_SIZE(store_raw) == 16) sf |= STOREHOST_V6_FLAG;
            sys_flag = sf;
            if ((sf & BORNHOST_V6_FLAG) && ts_positions == NULL) {
                Py_ssize_t k = PyList_GET_SIZE(sizes);
                ts_positions = PyList_New(k);
                if (ts_positions == NULL) {
                    Py_DECREF(props_s);
                    goto done;
                }
                for (Py_ssize_t j = 0; j < k; j++) {
                    PyObject *v = PyLong_FromLong(56);
                    if (v == NULL) {
                        Py_DECREF(props_s);
                        goto done;
                    }
                    PyList_SET_ITEM(ts_positions, j, v);
                }
            }
            /* ports are packed (and checked) per record in Python: re-read below */
        } else {
            Py_DECREF(born);
            Py_DECREF(store);
            Py_DECREF(msys);
        }

        PyObject *body = get_field(&fl, msg, F_BODY);
        if (body == NULL) {
            Py_DECREF(props_s);
            goto done;
        }
        Py_buffer bview;
        if (PyObject_GetBuffer(body, &bview, PyBUF_SIMPLE) < 0) {
            Py_DECREF(body);
            Py_DECREF(props_s);
            goto done;
        }
        Py_DECREF(body); /* the buffer export keeps the object alive */
        Py_ssize_t topic_len = PyBytes_GET_SIZE(topic_b);
        Py_ssize_t born_len = PyBytes_GET_SIZE(born_raw), store_len = PyBytes_GET_SIZE(store_raw);
        Py_ssize_t fixed = 4 * 8 + 4 * 4 + born_len + 4 + 8 + store_len + 4 + 4 + 8 + 4;
        long long total = (long long)fixed + bview.len + 3 + topic_len + props_len;
        uint32_t crc = crc32_any(0, bview.buf, (size_t)bview.len) & 0x7FFFFFFFu;
        long long queue_id, flag, born_ts, reconsume, prepared;
        if (attr_ll(&fl, msg, F_QUEUE_ID, I32_MIN, I32_MAX, &queue_id, enc_err) < 0 ||
            attr_ll(&fl, msg, F_FLAG, I32_MIN, I32_MAX, &flag, enc_err) < 0 ||
            attr_ll(&fl, msg, F_BORN_TS, I64_MIN, I64_MAX, &born_ts, enc_err) < 0 ||
            host_port(last_born, enc_err, "born port", &born_port) < 0 ||
            host_port(last_store, enc_err, "store port", &store_port) < 0 ||
            attr_ll(&fl, msg, F_RECONSUME, I32_MIN, I32_MAX, &reconsume, enc_err) < 0 ||
            attr_ll(&fl, msg, F_PREPARED, I64_MIN, I64_MAX, &prepared, enc_err) < 0) {
            PyBuffer_Release(&bview);
            Py_DECREF(props_s);
            goto done;
        }
        if (total > I32_MAX || sys_flag < I32_MIN || sys_flag > I32_MAX) {
            PyErr_SetString(enc_err, total > I32_MAX ? "field out of range: record too large"
                                                     : "field out of range: sys_flag");
            PyBuffer_Release(&bview);
            Py_DECREF(props_s);
            goto done;
        }
        Py_ssize_t old = PyByteArray_GET_SIZE(buf);
        if (PyByteArray_Resize(buf, old + (Py_ssize_t)total) < 0) {
            PyBuffer_Release(&bview);
            Py_DECREF(props_s);
            goto done;
        }
        unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(buf) + old;
        put_be32(p, (uint32_t)total);
        put_be32(p + 4, MESSAGE_MAGIC_CODE);
        put_be32(p + 8, crc);
        put_be32(p + 12, (uint32_t)queue_id);
        put_be32(p + 16, (uint32_t)flag);
        memset(p + 20, 0, 16); /* queue offset, physical offset */
        put_be32(p + 36, (uint32_t)sys_flag);
        put_be64(p + 40, (uint64_t)born_ts);
        unsigned char *q = p + 48;
        memcpy(q, PyBytes_AS_STRING(born_raw), (size_t)born_len);
        q += born_len;
        put_be32(q, (uint32_t)born_port);
        q += 4;
        memset(q, 0, 8); /* store timestamp */
        q += 8;
        memcpy(q, PyBytes_AS_STRING(store_raw), (size_t)store_len);
        q += store_len;
        put_be32(q, (uint32_t)store_port);
        q += 4;
        put_be32(q, (uint32_t)reconsume);
        q += 4;
        put_be64(q, (uint64_t)prepared);
        q += 8;
        put_be32(q, (uint32_t)bview.len);
        q += 4;
        if (bview.len) memcpy(q, bview.buf, (size_t)bview.len);
        q += bview.len;
        PyBuffer_Release(&bview);
        *q++ = (unsigned char)topic_len;
        if (topic_len) memcpy(q, PyBytes_AS_STRING(topic_b), (size_t)topic_len);
        q += topic_len;
        put_be16(q, (uint16_t)props_len);
        q += 2;
        if (props_len) memcpy(q, props_c, (size_t)props_len);
        Py_DECREF(props_s);

        PyObject *sz = PyLong_FromLongLong(total);
        if (sz == NULL) goto done;
        int rc = PyList_Append(sizes, sz);
        Py_DECREF(sz);
        if (rc < 0) goto done;
        if (ts_positions != NULL) {
            PyObject *tp = PyLong_FromLong((sys_flag & BORNHOST_V6_FLAG) ? 68 : 56);
            if (tp == NULL) goto done;
            rc = PyList_Append(ts_positions, tp);
            Py_DECREF(tp);
            if (rc < 0) goto done;
        }
    }
    {
        PyObject *host = (same_store && last_store != NULL) ? last_store : Py_None;
        result = PyTuple_Pack(4, buf, sizes, ts_positions != NULL ? ts_positions : Py_None, host);
    }
done:
    Py_DECREF(seq);
    Py_XDECREF(buf);
    Py_XDECREF(sizes);
    Py_XDECREF(ts_positions);
    Py_XDECREF(last_topic);
    Py_XDECREF(topic_b);
    Py_XDECREF(last_born);
    Py_XDECREF(last_store);
    Py_XDECREF(last_sys);
    Py_XDECREF(born_raw);
    Py_XDECREF(store_raw);
    return result;
}

/* ------------------------------------------------------------------ patch_records */

/*
 * patch_records(buf, sizes, ts_positions, start, stop, buf_pos, queue_offset, physical_offset,
 *               store_timestamp, phy_out) -> None
 */
static PyObject *sp_patch_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "patch_records(buf, sizes, ts_positions, start, stop, buf_pos, "
                        "queue_offset, physical_offset, store_timestamp, phy_out)");
        return NULL;
    }
    PyObject *sizes = args[1], *ts_pos = args[2], *phy_out = args[9];
    if (!PyList_Check(sizes) || (ts_pos != Py_None && !PyList_Check(ts_pos)) ||
        !PyList_Check(phy_out)) {
        PyErr_SetString(PyExc_TypeError, "sizes, ts_positions and phy_out must be lists");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[3]);
    Py_ssize_t stop = PyLong_AsSsize_t(args[4]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[5]);
    long long qo = PyLong_AsLongLong(args[6]);
    long long phy = PyLong_AsLongLong(args[7]);
    long long ts = PyLong_AsLongLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (start < 0 || stop > PyList_GET_SIZE(sizes) ||
        (ts_pos != Py_None && stop > PyList_GET_SIZE(ts_pos)) || pos < 0) {
        PyErr_SetString(PyExc_IndexError, "record index out of range");
        return NULL;
    }
    Py_buffer view;
    if (get_writable(args[0], &view) < 0) return NULL;
    unsigned char *b = view.buf;
    PyObject *res = NULL;
    for (Py_ssize_t k = start; k < stop; k++) {
        /* (re-checked: converting an item may run Python code that shrinks the lists) */
        if (k >= PyList_GET_SIZE(sizes) || (ts_pos != Py_None && k >= PyList_GET_SIZE(ts_pos))) {
            PyErr_SetString(PyExc_IndexError, "record index out of range");
            goto out;
        }
        long long size = PyLong_AsLongLong(PyList_GET_ITEM(sizes, k));
        if (size == -1 && PyErr_Occurred()) goto out;
        long long tpos = 56;
        if (ts_pos != Py_None) {
            tpos = PyLong_AsLongLong(PyList_GET_ITEM(ts_pos, k));
            if (tpos == -1 && PyErr_Occurred()) goto out;
        }
        if (size < 0 || tpos < 36 || tpos + 8 > view.len || pos > view.len - 36 ||
            pos > view.len - (Py_ssize_t)tpos - 8) {
            PyErr_SetString(PyExc_ValueError, "record position beyond the buffer");
            as_struct_error();
            goto out;
        }
        put_be64(b + pos + 20, (uint64_t)qo);
        put_be64(b + pos + 28, (uint64_t)phy);
        put_be64(b + pos + tpos, (uint64_t)ts);
        PyObject *v = PyLong_FromLongLong(phy);
        if (v == NULL) goto out;
        int rc = PyList_Append(phy_out, v);
        Py_DECREF(v);
        if (rc < 0) goto out;
        pos += (Py_ssize_t)size;
        phy += size;
        qo += 1;
    }
    res = Py_NewRef(Py_None);
out:
    PyBuffer_Release(&view);
    return res;
}

/* ------------------------------------------------------------------ message ids */

static const char HEX[] = "0123456789ABCDEF";

/* offset_msg_ids(host_hex, phys) -> [host_hex + "%016X" % p for p in phys] */
static PyObject *sp_offset_msg_ids(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "offset_msg_ids(host_hex: str, phys)");
        return NULL;
    }
    Py_ssize_t hlen;
    const char *host = PyUnicode_AsUTF8AndSize(args[0], &hlen);
    if (host == NULL) return NULL;
    if (!PyUnicode_IS_ASCII(args[0]) || hlen > 64) {
        PyErr_SetString(PyExc_ValueError, "host_hex must be at most 64 ASCII characters");
        return NULL;
    }
    PyObject *seq = PySequence_Tuple(args[1]);
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    char tmp[96];
    memcpy(tmp, host, (size_t)hlen);
    for (Py_ssize_t i = 0; i < n; i++) {
        long long p = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (p == -1 && PyErr_Occurred()) goto fail;
        if (p < 0) {
            PyErr_SetString(PyExc_ValueError, "negative commitlog offset");
            goto fail;
        }
        uint64_t v = (uint64_t)p;
        for (int k = 15; k >= 0; k--) {
            tmp[hlen + k] = HEX[v & 0xF];
            v >>= 4;
        }
        PyObject *s = PyUnicode_FromStringAndSize(tmp, hlen + 16);
        if (s == NULL) goto fail;
        PyList_SET_ITEM(out, i, s);
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

/* ------------------------------------------------------------------ consume queue units */

/* pack_cq_units(phys, sizes, tags_codes) -> bytes of 20-byte '>qiq' units */
static PyObject *sp_pack_cq_units(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pack_cq_units(phys, sizes, tags_codes)");
        return NULL;
    }
    PyObject *a = PySequence_Tuple(args[0]);
    PyObject *b = a ? PySequence_Tuple(args[1]) : NULL;
    PyObject *c = b ? PySequence_Tuple(args[2]) : NULL;
    PyObject *out = NULL;
    if (c == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
    if (PySequence_Fast_GET_SIZE(b) < n || PySequence_Fast_GET_SIZE(c) < n) n = -1;
    if (n > PY_SSIZE_T_MAX / 20) n = -1;
    if (n < 0 || PySequence_Fast_GET_SIZE(b) != PySequence_Fast_GET_SIZE(a) ||
        PySequence_Fast_GET_SIZE(c) != PySequence_Fast_GET_SIZE(a)) {
        /* map() stops at the shortest: mirror that */
        n = PySequence_Fast_GET_SIZE(a);
        if (PySequence_Fast_GET_SIZE(b) < n) n = PySequence_Fast_GET_SIZE(b);
        if (PySequence_Fast_GET_SIZE(c) < n) n = PySequence_Fast_GET_SIZE(c);
    }
    out = PyBytes_FromStringAndSize(NULL, n * 20);
    if (out == NULL) goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        long long phy, size, tags;
        if (get_ll(PySequence_Fast_GET_ITEM(a, i), I64_MIN, I64_MAX, &phy, NULL, "phy") < 0 ||
            get_ll(PySequence_Fast_GET_ITEM(b, i), I32_MIN, I32_MAX, &size, NULL, "size") < 0 ||
            get_ll(PySequence_Fast_GET_ITEM(c, i), I64_MIN, I64_MAX, &tags, NULL, "tags") < 0) {
            as_struct_error();
            Py_CLEAR(out);
            goto done;
        }
        put_be64(p, (uint64_t)phy);
        put_be32(p + 8, (uint32_t)size);
        put_be64(p + 12, (uint64_t)tags);
        p += 20;
    }
done:
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(c);
    return out;
}

/* ------------------------------------------------------------------ index */

static int append_pair(PyObject *hashes, PyObject *phys, uint32_t h, PyObject *phy) {
    PyObject *v = PyLong_FromLong((long)abs32(h));
    if (v == NULL) return -1;
    int rc = PyList_Append(hashes, v);
    Py_DECREF(v);
    if (rc < 0) return -1;
    return PyList_Append(phys, phy);
}

/*
 * index_hashes(prefix, phy_offsets, uniq_keys, keys, end, indexed) -> (hashes, phys)
 * The key hashes `IndexService.build_index_batch` writes, in order: for each record not yet
 * indexed (offset > end, or == end and not `indexed`), prefix+UNIQ_KEY, then prefix+each
 * non-empty space-separated KEYS token.
 */
static PyObject *sp_index_hashes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "index_hashes(prefix: str, phy_offsets, uniq_keys, keys, end, indexed)");
        return NULL;
    }
    long long end = PyLong_AsLongLong(args[4]);
    if (end == -1 && PyErr_Occurred()) return NULL;
    int indexed = PyObject_IsTrue(args[5]);
    if (indexed < 0) return NULL;
    PyObject *ph = PySequence_Tuple(args[1]);
    PyObject *uq = ph ? PySequence_Tuple(args[2]) : NULL;
    PyObject *ks = uq ? PySequence_Tuple(args[3]) : NULL;
    PyObject *hashes = NULL, *phys = NULL, *res = NULL;
    if (ks == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ph);
    if (PySequence_Fast_GET_SIZE(uq) != n || PySequence_Fast_GET_SIZE(ks) != n) {
        PyErr_SetString(PyExc_ValueError, "phy_offsets, uniq_keys and keys differ in length");
        goto done;
    }
    hashes = PyList_New(0);
    phys = PyList_New(0);
    if (hashes == NULL || phys == NULL) goto done;
    if (PyUnicode_READY(args[0]) < 0) goto done;
    uint32_t hp = java_hash_cont(0, args[0]);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *phy = PySequence_Fast_GET_ITEM(ph, i);
        PyObject *uniq = PySequence_Fast_GET_ITEM(uq, i);
        PyObject *key_list = PySequence_Fast_GET_ITEM(ks, i);
        if ((PyUnicode_Check(uniq) && PyUnicode_READY(uniq) < 0) ||
            (PyUnicode_Check(key_list) && PyUnicode_READY(key_list) < 0))
            goto done;
        int has_u = uniq != Py_None && (PyUnicode_Check(uniq) ? PyUnicode_GET_LENGTH(uniq) > 0
                                                              : PyObject_IsTrue(uniq));
        int has_k = key_list != Py_None &&
                    (PyUnicode_Check(key_list) ? PyUnicode_GET_LENGTH(key_list) > 0
                                               : PyObject_IsTrue(key_list));
        if (has_u < 0 || has_k < 0) goto done;
        if (!has_u && !has_k) continue;
        long long p = PyLong_AsLongLong(phy);
        if (p == -1 && PyErr_Occurred()) goto done;
        if (p < end || (p == end && indexed)) continue;
        if (has_u) {
            if (!PyUnicode_Check(uniq)) {
                PyErr_SetString(PyExc_TypeError, "a UNIQ_KEY must be a str");
                goto done;
            }
            if (append_pair(hashes, phys, java_hash_cont(hp, uniq), phy) < 0) goto done;
        }
        if (has_k) {
            if (!PyUnicode_Check(key_list)) {
                PyErr_SetString(PyExc_TypeError, "KEYS must be a str");
                goto done;
            }
            Py_ssize_t len = PyUnicode_GET_LENGTH(key_list);
            int kind = PyUnicode_KIND(key_list);
            const void *data = PyUnicode_DATA(key_list);
            uint32_t h = hp;
            Py_ssize_t tok = 0; /* characters in the current token */
            for (Py_ssize_t j = 0; j <= len; j++) {
                Py_UCS4 c = j < len ? PyUnicode_READ(kind, data, j) : ' ';
                if (c == ' ') {
                    if (tok > 0 && append_pair(hashes, phys, h, phy) < 0) goto done;
                    h = hp;
                    tok = 0;
                    continue;
                }
                tok++;
                if (c >= 0x10000) {
                    c -= 0x10000;
                    h = 31u * h + (0xD800u + (c >> 10));
                    h = 31u * h + (0xDC00u + (c & 0x3FF));
                } else {
                    h = 31u * h + c;
                }
            }
        }
    }
    res = PyTuple_Pack(2, hashes, phys);
done:
    Py_XDECREF(ph);
    Py_XDECREF(uq);
    Py_XDECREF(ks);
    Py_XDECREF(hashes);
    Py_XDECREF(phys);
    return res;
}

/*
 * index_put_hashes(mm, slot_num, entries_pos, count, hashes, phys, start, stop, time_diff)
 *   -> new_slots
 * Entries count, count+1, ... for hashes[start:stop] (the caller checked they fit): each
 * entry is (hash, phy, time_diff, previous entry of its slot), and the slot points at it.
 */
static PyObject *sp_index_put_hashes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "index_put_hashes(mm, slot_num, entries_pos, count, "
                                         "hashes, phys, start, stop, time_diff)");
        return NULL;
    }
    long long slot_num = PyLong_AsLongLong(args[1]);
    long long entries_pos = PyLong_AsLongLong(args[2]);
    long long count = PyLong_AsLongLong(args[3]);
    Py_ssize_t start = PyLong_AsSsize_t(args[6]);
    Py_ssize_t stop = PyLong_AsSsize_t(args[7]);
    long long time_diff = PyLong_AsLongLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_Check(args[4]) || !PyList_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "hashes and phys must be lists");
        return NULL;
    }
    PyObject *hashes = args[4], *phys = args[5];
    if (slot_num <= 0 || entries_pos < 40 || count < 0 || start < 0 ||
        stop > PyList_GET_SIZE(hashes) || stop > PyList_GET_SIZE(phys) || time_diff < I32_MIN ||
        time_diff > I32_MAX || count + (stop - start) > I32_MAX) {
        PyErr_SetString(PyExc_ValueError, "index_put_hashes: argument out of range");
        return NULL;
    }
    Py_buffer view;
    if (get_writable(args[0], &view) < 0) return NULL;
    unsigned char *b = view.buf;
    long long len = (long long)view.len;
    long long new_slots = 0;
    PyObject *res = NULL;
    if (len < 40 || slot_num > (len - 40) / 4 || entries_pos > len) {
        PyErr_SetString(PyExc_ValueError, "slots or entries beyond the mapping");
        as_struct_error();
        goto out;
    }
    for (Py_ssize_t k = start; k < stop; k++, count++) {
        long long h, phy;
        /* (re-checked: converting an item may run Python code that shrinks the lists) */
        if (k >= PyList_GET_SIZE(hashes) || k >= PyList_GET_SIZE(phys)) {
            PyErr_SetString(PyExc_IndexError, "hash index out of range");
            goto out;
        }
        if (get_ll(PyList_GET_ITEM(hashes, k), I32_MIN, I32_MAX, &h, PyExc_ValueError, "hash") <
                0 ||
            get_ll(PyList_GET_ITEM(phys, k), I64_MIN, I64_MAX, &phy, PyExc_ValueError, "phy") <
                0) {
            as_struct_error();
            goto out;
        }
        long long slot = h % slot_num; /* Python's modulo: never negative */
        if (slot < 0) slot += slot_num;
        long long slot_pos = 40 + slot * 4;
        long long epos = entries_pos + count * 20;
        if (epos + 20 > len) {
            PyErr_SetString(PyExc_ValueError, "index entry beyond the mapping");
            as_struct_error();
            goto out;
        }
        long long prev = (int32_t)get_be32(b + slot_pos);
        if (prev <= 0 || prev >= count) {
            prev = 0;
            new_slots++;
        }
        unsigned char *e = b + epos;
        put_be32(e, (uint32_t)h);
        put_be64(e + 4, (uint64_t)phy);
        put_be32(e + 12, (uint32_t)time_diff);
        put_be32(e + 16, (uint32_t)prev);
        put_be32(b + slot_pos, (uint32_t)count);
    }
    res = PyLong_FromLongLong(new_slots);
out:
    PyBuffer_Release(&view);
    return res;
}

/* ------------------------------------------------------------------ SEND_BATCH body */

/*
 * decode_batch_body(body, item_type, decode_error) -> list[item_type]
 * item_type is a tuple subclass of 3 fields: (flag, body bytes, properties str).
 */
static PyObject *sp_decode_batch_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyType_Check(args[1]) ||
        !PyType_IsSubtype((PyTypeObject *)args[1], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "decode_batch_body(body, item_type, decode_error)");
        return NULL;
    }
    PyTypeObject *item_type = (PyTypeObject *)args[1];
    PyObject *err = args[2];
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *d = view.buf;
    Py_ssize_t end = view.len, pos = 0;
    PyObject *items = PyList_New(0);
    if (items == NULL) goto fail;
    while (pos < end) {
        if (end - pos < 22) {
            PyErr_Format(err, "truncated batch item at %zd", pos);
            goto fail;
        }
        int32_t total = (int32_t)get_be32(d + pos);
        int32_t flag = (int32_t)get_be32(d + pos + 12);
        int32_t body_len = (int32_t)get_be32(d + pos + 16);
        if (body_len < 0) {
            PyErr_Format(err, "batch item at %zd: lengths do not add up", pos);
            goto fail;
        }
        Py_ssize_t b_start = pos + 20;
        if ((Py_ssize_t)body_len > end - b_start - 2) {
            PyErr_Format(err, "truncated batch item at %zd", pos);
            goto fail;
        }
        Py_ssize_t b_end = b_start + body_len;
        int16_t props_len = (int16_t)get_be16(d + b_end);
        if (props_len < 0) {
            PyErr_Format(err, "batch item at %zd: negative properties length", pos);
            goto fail;
        }
        if ((long long)total != 22LL + body_len + props_len) {
            PyErr_Format(err, "batch item at %zd: lengths do not add up", pos);
            goto fail;
        }
        if ((Py_ssize_t)total > end - pos) {
            PyErr_Format(err, "truncated batch item at %zd", pos);
            goto fail;
        }
        Py_ssize_t item_end = pos + total;
        PyObject *props = PyUnicode_DecodeUTF8((const char *)d + b_end + 2, props_len, NULL);
        if (props == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                PyErr_Format(err, "batch item at %zd: properties are not UTF-8", pos);
            }
            goto fail;
        }
        PyObject *fl = PyLong_FromLong(flag);
        PyObject *bd = fl ? PyBytes_FromStringAndSize((const char *)d + b_start, body_len) : NULL;
        PyObject *item = bd ? item_type->tp_alloc(item_type, 3) : NULL;
        if (item == NULL) {
            Py_DECREF(props);
            Py_XDECREF(fl);
            Py_XDECREF(bd);
            goto fail;
        }
        PyTuple_SET_ITEM(item, 0, fl);
        PyTuple_SET_ITEM(item, 1, bd);
        PyTuple_SET_ITEM(item, 2, props);
        int rc = PyList_Append(items, item);
        Py_DECREF(item);
        if (rc < 0) goto fail;
        pos = item_end;
    }
    PyBuffer_Release(&view);
    return items;
fail:
    PyBuffer_Release(&view);
    Py_XDECREF(items);
    return NULL;
}

/* Number of \x02 in `s`. */
static Py_ssize_t count_sep(PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), c = 0;
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyUnicode_READ(kind, data, i) == 2) c++;
    return c;
}

/* UTF-8 size of a str (ASCII without encoding). */
static Py_ssize_t utf8_size(PyObject *s) {
    if (PyUnicode_IS_ASCII(s)) return PyUnicode_GET_LENGTH(s);
    Py_ssize_t size;
    if (PyUnicode_AsUTF8AndSize(s, &size) == NULL) return -1;
    return size;
}

/*
 * build_batch_messages(items, msg_type, topic, queue_id, sys_flag, born_timestamp, born_host,
 *                      store_host, batch_props, override, suffix, max_props, reuse_properties)
 *   -> (msgs, error_index, error_kind)
 *
 * `SendProcessor.send_batch`'s per-message loop. Stops at the first item with an empty body
 * (error_kind 1) or stored properties larger than max_props (error_kind 2); error_index -1
 * when none. A message whose stored properties must be re-encoded from the dict gets
 * properties_string None (the caller encodes it and checks its size).
 */
static PyObject *sp_build_batch_messages(PyObject *self, PyObject *const *args,
                                         Py_ssize_t nargs) {
    (void)self;
    if (nargs != 13 || !PyType_Check(args[1]) || !PyUnicode_Check(args[2]) ||
        !PyDict_Check(args[8]) || !PyAnySet_Check(args[9]) || !PyUnicode_Check(args[10])) {
        PyErr_SetString(PyExc_TypeError,
                        "build_batch_messages(items, msg_type, topic: str, queue_id, sys_flag, "
                        "born_timestamp, born_host, store_host, batch_props: dict, "
                        "override: set, suffix: str, max_props, reuse_properties)");
        return NULL;
    }
    PyTypeObject *msg_type = (PyTypeObject *)args[1];
    PyObject *topic = args[2], *queue_id = args[3], *sys_flag = args[4], *born_ts = args[5];
    PyObject *born_host = args[6], *store_host = args[7], *batch_props = args[8];
    PyObject *override = args[9], *suffix = args[10], *reuse = args[12];
    long long max_props = PyLong_AsLongLong(args[11]);
    if (max_props == -1 && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Tuple(args[0]);
    if (seq == NULL) return NULL;
    PyObject *msgs = PyList_New(0);
    PyObject *sep_suffix = NULL, *zero = NULL, *empty = NULL, *res = NULL;
    Py_ssize_t err_index = -1;
    int err_kind = 0;
    fields_t fl;
    fields_for(&fl, msg_type);
    if (msgs == NULL) goto done;
    sep_suffix = PyUnicode_FromFormat("\x02%U", suffix);
    zero = PyLong_FromLong(0);
    empty = PyTuple_New(0);
    if (sep_suffix == NULL || zero == NULL || empty == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "batch items must be (flag, body, properties)");
            goto done;
        }
        PyObject *flag = PyTuple_GET_ITEM(item, 0);
        PyObject *body = PyTuple_GET_ITEM(item, 1);
        PyObject *raw = PyTuple_GET_ITEM(item, 2);
        int nonempty = PyObject_IsTrue(body);
        if (nonempty < 0) goto done;
        if (!nonempty) {
            err_index = i;
            err_kind = 1;
            break;
        }
        if (!PyUnicode_Check(raw)) {
            PyErr_SetString(PyExc_TypeError, "batch item properties must be a str");
            goto done;
        }
        if (PyUnicode_READY(raw) < 0) goto done;
        PyObject *props = PyDict_New();
        if (props == NULL) goto done;
        PyObject *stored = NULL;
        if (PyUnicode_GET_LENGTH(raw) > 0) {
            if (decode_props_into(props, raw) == NULL) {
                Py_DECREF(props);
                goto done;
            }
            /* override.isdisjoint(props) */
            int disjoint = 1;
            Py_ssize_t ppos = 0;
            PyObject *key, *val;
            while (PyDict_Next(props, &ppos, &key, &val)) {
                int in = PySet_Contains(override, key);
                if (in < 0) {
                    Py_DECREF(props);
                    goto done;
                }
                if (in) {
                    disjoint = 0;
                    break;
                }
            }
            if (!disjoint) {
                stored = Py_NewRef(Py_None);
            } else {
                int has_wait = PyDict_Contains(props, s_WAIT);
                if (has_wait < 0) {
                    Py_DECREF(props);
                    goto done;
                }
                if (!has_wait && PyDict_GET_SIZE(props) == count_sep(raw) + 1) {
                    stored = PyUnicode_Concat(raw, sep_suffix);
                } else {
                    PyObject *cargs[3] = {raw, props, suffix};
                    stored = PyObject_Vectorcall(reuse, cargs, 3, NULL);
                }
                if (stored == NULL) {
                    Py_DECREF(props);
                    goto done;
                }
            }
        } else {
            stored = Py_NewRef(suffix);
        }
        if (PyDict_Update(props, batch_props) < 0) {
            Py_DECREF(props);
            Py_DECREF(stored);
            goto done;
        }
        /* tags code: Java hash of TAGS (0 without) */
        long tags = 0;
        PyObject *tv = PyDict_GetItemWithError(props, s_TAGS);
        if (tv == NULL && PyErr_Occurred()) {
            Py_DECREF(props);
            Py_DECREF(stored);
            goto done;
        }
        if (tv != NULL && PyUnicode_Check(tv)) {
            if (PyUnicode_READY(tv) < 0) {
                Py_DECREF(props);
                Py_DECREF(stored);
                goto done;
            }
            if (PyUnicode_GET_LENGTH(tv) > 0) tags = (long)(int32_t)java_hash_cont(0, tv);
        }
        /* object.__new__(msg_type): the slots are set below, __init__ is not run */
        PyObject *msg = msg_type->tp_new(msg_type, empty, NULL);
        PyObject *tags_obj = msg != NULL ? PyLong_FromLong(tags) : NULL;
        if (tags_obj == NULL || set_field(&fl, msg, F_TOPIC, topic) < 0 ||
            set_field(&fl, msg, F_BODY, body) < 0 ||
            set_field(&fl, msg, F_QUEUE_ID, queue_id) < 0 ||
            set_field(&fl, msg, F_FLAG, flag) < 0 ||
            set_field(&fl, msg, F_PROPERTIES, props) < 0 ||
            set_field(&fl, msg, F_PROPERTIES_STRING, stored) < 0 ||
            set_field(&fl, msg, F_SYS_FLAG, sys_flag) < 0 ||
            set_field(&fl, msg, F_BORN_TS, born_ts) < 0 ||
            set_field(&fl, msg, F_BORN_HOST, born_host) < 0 ||
            set_field(&fl, msg, F_STORE_HOST, store_host) < 0 ||
            set_field(&fl, msg, F_RECONSUME, zero) < 0 ||
            set_field(&fl, msg, F_PREPARED, zero) < 0 ||
            set_field(&fl, msg, F_TAGS_CODE, tags_obj) < 0) {
            Py_XDECREF(tags_obj);
            Py_XDECREF(msg);
            Py_DECREF(props);
            Py_DECREF(stored);
            goto done;
        }
        Py_DECREF(tags_obj);
        Py_DECREF(props);
        int too_big = 0;
        if (stored != Py_None && !PyUnicode_Check(stored)) {
            PyErr_SetString(PyExc_TypeError, "reuse_properties must return a str or None");
            Py_DECREF(msg);
            Py_DECREF(stored);
            goto done;
        }
        if (stored != Py_None) {
            Py_ssize_t size = utf8_size(stored);
            if (size < 0) {
                Py_DECREF(msg);
                Py_DECREF(stored);
                goto done;
            }
            too_big = size > max_props;
        }
        Py_DECREF(stored);
        int rc = PyList_Append(msgs, msg);
        Py_DECREF(msg);
        if (rc < 0) goto done;
        if (too_big) {
            err_index = i;
            err_kind = 2;
            break;
        }
    }
    res = Py_BuildValue("(Oni)", msgs, err_index, err_kind);
done:
    Py_DECREF(seq);
    Py_XDECREF(msgs);
    Py_XDECREF(sep_suffix);
    Py_XDECREF(zero);
    Py_XDECREF(empty);
    return res;
}

/* ------------------------------------------------------------------ pull bodies */

/* The slots `decode_records_into` fills, in this order. */
enum {
    R_TOPIC, R_BODY, R_FLAG, R_PROPS, R_PROPS_RAW, R_PENDING, R_QUEUE_ID, R_QUEUE_OFFSET,
    R_PHY_OFFSET, R_SYS_FLAG, R_BORN_TS, R_BORN_HOST, R_BORN_IP, R_BORN_PORT, R_STORE_TS,
    R_STORE_HOST, R_STORE_IP, R_STORE_PORT, R_RECONSUME, R_PREPARED, R_STORE_SIZE,
    R_OFFSET_MSG_ID, R_BROKER_NAME, R_N
};

static const char *const record_slot_names[R_N] = {
    "topic", "body", "flag", "_props", "_props_raw", "_pending", "queue_id", "queue_offset",
    "commit_log_offset", "sys_flag", "born_timestamp", "_born_host", "_born_ip", "_born_port",
    "store_timestamp", "_store_host", "_store_ip", "_store_port", "reconsume_times",
    "prepared_transaction_offset", "store_size", "_offset_msg_id", "broker_name",
};

static PyObject *record_slots[R_N]; /* record_slot_names interned, once in PyInit */

static int intern_record_slots(void) {
    for (int i = 0; i < R_N; i++)
        if ((record_slots[i] = PyUnicode_InternFromString(record_slot_names[i])) == NULL) return -1;
    return 0;
}

/* Offsets of `tp`'s plain object slots named as record_slot_names; 0 if one is not such a
 * slot (a property, a __dict__ attribute), else 1. */
static int record_slot_offsets(PyTypeObject *tp, Py_ssize_t *off) {
    for (int i = 0; i < R_N; i++)
        if ((off[i] = plain_slot_offset(tp, record_slots[i])) == 0) return 0;
    return 1;
}

static inline int64_t get_be64s(const unsigned char *p) {
    return (int64_t)(((uint64_t)get_be32(p) << 32) | (uint64_t)get_be32(p + 4));
}

#define MESSAGE_MAGIC_CODE_V2 0xDAA320ABu
#define COMPRESSED_FLAG 0x1
#define RECORD_V4_FIXED 88
#define MIN_RECORD_SIZE 91

/* The layout of one record in a pull body, as the native decoders read it. */
typedef struct {
    const unsigned char *r; /* the record's first byte */
    int32_t total, sys_flag, body_len;
    Py_ssize_t rec_end, body_start, topic_start, topic_end, props_start;
} record_view;

/* Fill `v` with the record at `offset` when it is the plain case the native decoders handle:
 * IPv4 hosts, not compressed, V1 or V2 magic, sizes that agree with each other and fit in
 * `end`. 0 when it is; -1 (nothing raised) when the Python decoder must take the body. */
static int plain_record(const unsigned char *b, Py_ssize_t offset, Py_ssize_t end,
                        record_view *v) {
    if (end - offset < MIN_RECORD_SIZE) return -1;
    const unsigned char *r = b + offset;
    int32_t total = (int32_t)get_be32(r);
    uint32_t magic = get_be32(r + 4);
    int32_t sys_flag = (int32_t)get_be32(r + 36);
    int32_t body_len = (int32_t)get_be32(r + 84);
    if (sys_flag & (HOST_MASK | COMPRESSED_FLAG)) return -1;
    if (total < MIN_RECORD_SIZE || total > end - offset || body_len < 0 ||
        body_len > total - RECORD_V4_FIXED - 3)
        return -1;
    Py_ssize_t rec_end = offset + total;
    Py_ssize_t body_start = offset + RECORD_V4_FIXED;
    Py_ssize_t body_end = body_start + body_len;
    Py_ssize_t topic_start, topic_end;
    if (magic == MESSAGE_MAGIC_CODE) {
        topic_start = body_end + 1;
        topic_end = topic_start + b[body_end];
    } else if (magic == MESSAGE_MAGIC_CODE_V2) {
        topic_start = body_end + 2;
        topic_end = topic_start + get_be16(b + body_end);
    } else {
        return -1;
    }
    Py_ssize_t props_start = topic_end + 2;
    if (props_start > rec_end ||
        (int16_t)get_be16(b + topic_end) != (Py_ssize_t)(rec_end - props_start))
        return -1;
    v->r = r;
    v->total = total;
    v->sys_flag = sys_flag;
    v->body_len = body_len;
    v->rec_end = rec_end;
    v->body_start = body_start;
    v->topic_start = topic_start;
    v->topic_end = topic_end;
    v->props_start = props_start;
    return 0;
}

/*
 * decode_records_into(buf: bytes, cls: type, broker_name: str) -> list | None
 * The records of a pull body as new `cls` objects (not initialised: every slot named in
 * record_slot_names is set, the lazily decoded ones to None). None, with nothing raised, when
 * the body needs the Python decoder: a record that fails a check, IPv6 hosts, a compressed body,
 * properties that are not ASCII, or a `cls` without those plain slots.
 */
static PyObject *sp_decode_records_into(PyObject *self, PyObject *const *args,
                                        Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyType_Check(args[1]) ||
        !PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "decode_records_into(buf: bytes, cls: type, broker_name: str)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[1];
    PyObject *broker_name = args[2];
    Py_ssize_t off[R_N];
    if (!record_slot_offsets(cls, off)) Py_RETURN_NONE;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t end = PyBytes_GET_SIZE(args[0]);
    PyObject *out = PyList_New(0);
    PyObject *empty = PyTuple_New(0);
    PyObject *topic = NULL; /* the last topic decoded, with its raw bytes */
    const unsigned char *topic_raw = NULL;
    Py_ssize_t topic_len = -1;
    if (out == NULL || empty == NULL) goto fail;
    Py_ssize_t offset = 0;
    while (offset < end) {
        record_view rv;
        if (plain_record(b, offset, end, &rv) < 0) goto fallback;
        const unsigned char *r = rv.r;
        int32_t total = rv.total, sys_flag = rv.sys_flag, body_len = rv.body_len;
        Py_ssize_t rec_end = rv.rec_end, pos = rv.body_start;
        Py_ssize_t topic_start = rv.topic_start, topic_end = rv.topic_end;
        Py_ssize_t props_start = rv.props_start;
        for (Py_ssize_t k = props_start; k < rec_end; k++)
            if (b[k] & 0x80) goto fallback; /* non-ASCII: the Python path checks the UTF-8 */
        Py_ssize_t tlen = topic_end - topic_start;
        if (topic == NULL || tlen != topic_len || memcmp(topic_raw, b + topic_start, tlen) != 0) {
            PyObject *t = PyUnicode_DecodeUTF8((const char *)b + topic_start, tlen, NULL);
            if (t == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto fail;
                PyErr_Clear();
                goto fallback;
            }
            Py_XSETREF(topic, t);
            topic_raw = b + topic_start;
            topic_len = tlen;
        }
        PyObject *v[R_N];
        v[R_TOPIC] = Py_NewRef(topic);
        v[R_BODY] = PyBytes_FromStringAndSize((const char *)b + pos, body_len);
        v[R_FLAG] = PyLong_FromLong((int32_t)get_be32(r + 16));
        v[R_PROPS] = Py_NewRef(Py_None);
        v[R_PROPS_RAW] = PyBytes_FromStringAndSize((const char *)b + props_start,
                                                   rec_end - props_start);
        v[R_PENDING] = Py_NewRef(Py_None);
        v[R_QUEUE_ID] = PyLong_FromLong((int32_t)get_be32(r + 12));
        v[R_QUEUE_OFFSET] = PyLong_FromLongLong(get_be64s(r + 20));
        v[R_PHY_OFFSET] = PyLong_FromLongLong(get_be64s(r + 28));
        v[R_SYS_FLAG] = PyLong_FromLong(sys_flag);
        v[R_BORN_TS] = PyLong_FromLongLong(get_be64s(r + 40));
        v[R_BORN_HOST] = Py_NewRef(Py_None);
        v[R_BORN_IP] = PyBytes_FromStringAndSize((const char *)r + 48, 4);
        v[R_BORN_PORT] = PyLong_FromLong((int32_t)get_be32(r + 52));
        v[R_STORE_TS] = PyLong_FromLongLong(get_be64s(r + 56));
        v[R_STORE_HOST] = Py_NewRef(Py_None);
        v[R_STORE_IP] = PyBytes_FromStringAndSize((const char *)r + 64, 4);
        v[R_STORE_PORT] = PyLong_FromLong((int32_t)get_be32(r + 68));
        v[R_RECONSUME] = PyLong_FromLong((int32_t)get_be32(r + 72));
        v[R_PREPARED] = PyLong_FromLongLong(get_be64s(r + 76));
        v[R_STORE_SIZE] = PyLong_FromLong(total);
        v[R_OFFSET_MSG_ID] = Py_NewRef(Py_None);
        v[R_BROKER_NAME] = Py_NewRef(broker_name);
        /* object.__new__(cls): the slots are set below, __init__ is not run */
        PyObject *m = cls->tp_new(cls, empty, NULL);
        int failed = m == NULL;
        for (int i = 0; i < R_N; i++) {
            if (v[i] == NULL) failed = 1;
        }
        if (failed) {
            for (int i = 0; i < R_N; i++) Py_XDECREF(v[i]);
            Py_XDECREF(m);
            goto fail;
        }
        for (int i = 0; i < R_N; i++) {
            PyObject **slot = (PyObject **)((char *)m + off[i]);
            PyObject *old = *slot;
            *slot = v[i]; /* the reference is moved into the slot */
            Py_XDECREF(old);
        }
        int rc = PyList_Append(out, m);
        Py_DECREF(m);
        if (rc < 0) goto fail;
        offset = rec_end;
    }
    Py_XDECREF(topic);
    Py_DECREF(empty);
    return out;
fallback:
    Py_XDECREF(topic);
    Py_XDECREF(empty);
    Py_XDECREF(out);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(topic);
    Py_XDECREF(empty);
    Py_XDECREF(out);
    return NULL;
}

/* ------------------------------------------------------------------ record checks (recovery) */

/* check_record(buf, offset, check_crc, max_size, req_type, statuses) and
 * scan_records(buf, pos, base, file_from, file_size, check_crc, max_size, req_type, statuses):
 * common.message._check and the scan loop of store._recovery.RecordScanner (their references).
 * `req_type` is common.message.DispatchRequest (a tuple subclass of 15 fields, built here item by
 * item), `statuses` the DispatchStatus members in value order (OK, BLANK, END, INVALID). Bytes
 * that are no record never raise: they give END or INVALID exactly where the references do. Every
 * read stays within the buffer: each length is checked against what is left before it is used. */

#define BLANK_MAGIC_CODE 0xCBD43194u
#define BLANK_RECORD_SIZE 8
#define REQ_FIELDS 15
/* The body CRC of bodies this large runs without the GIL; taking it back may wait a switch
 * interval for another thread, which smaller bodies would pay for nothing. */
#define CRC_NOGIL_MIN (64 * 1024)

enum { ST_OK, ST_BLANK, ST_END, ST_INVALID };

/* Where the parts of a record that passed the layout checks are, as indexes into its buffer. */
typedef struct {
    int32_t total, sys_flag;
    Py_ssize_t rec, body_start, body_end, topic_start, topic_end, props_start, rec_end;
    Py_ssize_t store_ts, prepared; /* positions of STORETIMESTAMP and PREPARED_TRANSACTION_OFFSET */
} rec_layout;

/* The checks of `_check` up to the UTF-8 decoding, on the bytes b[offset:end]. ST_OK with `l`
 * filled; ST_BLANK with l->total the padding size; ST_END; ST_INVALID. */
static int check_layout(const unsigned char *b, Py_ssize_t offset, Py_ssize_t end, int check_crc,
                        long long max_size, rec_layout *l) {
    if (offset < 0) return ST_INVALID;
    if (offset >= end) return ST_END;
    Py_ssize_t avail = end - offset;
    if (avail < 8) {
        for (Py_ssize_t k = offset; k < end; k++)
            if (b[k]) return ST_INVALID;
        return ST_END;
    }
    const unsigned char *r = b + offset;
    int32_t total = (int32_t)get_be32(r);
    uint32_t magic = get_be32(r + 4);
    if (magic == BLANK_MAGIC_CODE) {
        if (total < BLANK_RECORD_SIZE || total > avail) return ST_INVALID;
        l->total = total;
        return ST_BLANK;
    }
    if (magic != MESSAGE_MAGIC_CODE) return total == 0 && magic == 0 ? ST_END : ST_INVALID;
    if (total < MIN_RECORD_SIZE || total > max_size || total > avail) return ST_INVALID;
    int32_t sys_flag = (int32_t)get_be32(r + 36);
    Py_ssize_t born = sys_flag & BORNHOST_V6_FLAG ? 16 : 4;
    Py_ssize_t store = sys_flag & STOREHOST_V6_FLAG ? 16 : 4;
    Py_ssize_t fixed = 80 + born + store; /* up to and including BODYLENGTH */
    if (total < fixed + 3) return ST_INVALID;
    int32_t body_len = (int32_t)get_be32(r + fixed - 4);
    /* body, topic length byte and properties length must fit: body_end + 3 <= rec_end */
    if (body_len < 0 || (Py_ssize_t)body_len > total - fixed - 3) return ST_INVALID;
    Py_ssize_t rec_end = offset + total;
    Py_ssize_t body_start = offset + fixed;
    Py_ssize_t body_end = body_start + body_len;
    Py_ssize_t topic_end = body_end + 1 + b[body_end];
    if (topic_end + 2 > rec_end) return ST_INVALID;
    int16_t props_len = (int16_t)get_be16(b + topic_end);
    if (props_len < 0 || topic_end + 2 + props_len != rec_end) return ST_INVALID;
    if (check_crc) {
        uint32_t crc;
        if (body_len >= CRC_NOGIL_MIN) {
            Py_BEGIN_ALLOW_THREADS crc = crc32_any(0, b + body_start, (size_t)body_len);
            Py_END_ALLOW_THREADS
        } else {
            crc = crc32_any(0, b + body_start, (size_t)body_len);
        }
        if ((int32_t)(crc & 0x7FFFFFFFu) != (int32_t)get_be32(r + 8)) return ST_INVALID;
    }
    l->total = total;
    l->sys_flag = sys_flag;
    l->rec = offset;
    l->body_start = body_start;
    l->body_end = body_end;
    l->topic_start = body_end + 1;
    l->topic_end = topic_end;
    l->props_start = topic_end + 2;
    l->rec_end = rec_end;
    l->store_ts = offset + 52 + born;
    l->prepared = offset + 68 + born + store;
    return ST_OK;
}

/* store._recovery.has_torn_tail of a record that passed `check_layout`: a NUL in the topic or
 * the properties (a write torn there left zeros the body CRC does not cover). */
static int torn_tail(const unsigned char *b, const rec_layout *l) {
    return memchr(b + l->topic_start, 0, (size_t)(l->topic_end - l->topic_start)) != NULL ||
           memchr(b + l->props_start, 0, (size_t)(l->rec_end - l->props_start)) != NULL;
}

/* A new `req_type` of REQ_FIELDS items, every item a new reference from `v` (all stolen, also
 * when it fails: NULL items mean an earlier allocation failed). */
static PyObject *new_request(PyTypeObject *req_type, PyObject **v) {
    int failed = 0;
    for (int k = 0; k < REQ_FIELDS; k++)
        if (v[k] == NULL) failed = 1;
    PyObject *req = failed ? NULL : req_type->tp_alloc(req_type, REQ_FIELDS);
    if (req == NULL) {
        for (int k = 0; k < REQ_FIELDS; k++) Py_XDECREF(v[k]);
        return NULL;
    }
    for (int k = 0; k < REQ_FIELDS; k++) PyTuple_SET_ITEM(req, k, v[k]);
    return req;
}

/* DispatchRequest(status, size): every other field at its default. */
static PyObject *plain_request(PyTypeObject *req_type, PyObject *status, long long size) {
    PyObject *v[REQ_FIELDS];
    v[0] = Py_NewRef(status);
    v[1] = PyLong_FromLongLong(size);
    v[2] = PyUnicode_FromStringAndSize("", 0); /* topic */
    for (int k = 3; k <= 8; k++) v[k] = PyLong_FromLong(0);
    v[9] = PyUnicode_FromStringAndSize("", 0); /* keys */
    v[10] = Py_NewRef(Py_None);                /* uniq_key */
    v[11] = PyLong_FromLong(0);
    v[12] = Py_NewRef(Py_None); /* properties */
    v[13] = PyLong_FromLong(0);
    v[14] = PyLong_FromLong(0);
    return new_request(req_type, v);
}

/* Strict UTF-8 text of b[start:end]: 1 with a new reference in *out, 0 when the bytes are not
 * UTF-8 (nothing raised: the record is INVALID), -1 with an exception set. */
static int utf8_text(const unsigned char *b, Py_ssize_t start, Py_ssize_t end, PyObject **out) {
    *out = PyUnicode_DecodeUTF8((const char *)b + start, end - start, NULL);
    if (*out != NULL) return 1;
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
    PyErr_Clear();
    return 0;
}

/* The OK DispatchRequest of a record that passed `check_layout`, with `topic` (borrowed, its
 * decoded topic): 1 with a new reference in *out, 0 when the properties are not UTF-8 (nothing
 * raised), -1 with an exception set. */
static int ok_request(const unsigned char *b, const rec_layout *l, PyTypeObject *req_type,
                      PyObject *ok, PyObject *topic, PyObject **out) {
    *out = NULL;
    PyObject *text;
    int rc = utf8_text(b, l->props_start, l->rec_end, &text);
    if (rc <= 0) return rc;
    PyObject *props = PyDict_New();
    if (props != NULL && PyUnicode_GET_LENGTH(text) > 0 && decode_props_into(props, text) == NULL)
        Py_CLEAR(props);
    Py_DECREF(text);
    if (props == NULL) return -1;
    /* borrowed from `props`, which the request keeps */
    PyObject *tags = NULL, *keys = NULL, *uniq = NULL;
    if (((tags = PyDict_GetItemWithError(props, s_TAGS)) == NULL && PyErr_Occurred()) ||
        ((keys = PyDict_GetItemWithError(props, s_KEYS)) == NULL && PyErr_Occurred()) ||
        ((uniq = PyDict_GetItemWithError(props, s_UNIQ_KEY)) == NULL && PyErr_Occurred())) {
        Py_DECREF(props);
        return -1;
    }
    /* tags_code: the Java hash of a non-empty TAGS value, else 0 */
    int32_t tags_code = 0;
    if (tags != NULL && PyUnicode_Check(tags) && PyUnicode_GET_LENGTH(tags) > 0)
        tags_code = (int32_t)java_hash_cont(0, tags);
    const unsigned char *r = b + l->rec;
    PyObject *v[REQ_FIELDS];
    v[0] = Py_NewRef(ok);
    v[1] = PyLong_FromLong(l->total);
    v[2] = Py_NewRef(topic);
    v[3] = PyLong_FromLong((int32_t)get_be32(r + 12));   /* queue_id */
    v[4] = PyLong_FromLongLong(get_be64s(r + 20));       /* queue_offset */
    v[5] = PyLong_FromLongLong(get_be64s(r + 28));       /* commit_log_offset */
    v[6] = PyLong_FromLong(tags_code);
    v[7] = PyLong_FromLongLong(get_be64s(b + l->store_ts));
    v[8] = PyLong_FromLong(l->sys_flag);
    v[9] = keys != NULL ? Py_NewRef(keys) : PyUnicode_FromStringAndSize("", 0);
    v[10] = Py_NewRef(uniq != NULL ? uniq : Py_None);
    v[11] = PyLong_FromLongLong(get_be64s(b + l->prepared));
    v[12] = props; /* the reference is moved into the request */
    v[13] = PyLong_FromLongLong(get_be64s(r + 40));      /* born_timestamp */
    v[14] = PyLong_FromLong((int32_t)get_be32(r + 8));   /* body_crc as stored */
    *out = new_request(req_type, v);
    return *out != NULL ? 1 : -1;
}

/* The arguments both functions share: the request type and the four statuses. */
static int request_kinds(PyObject *req_type, PyObject *statuses, const char *usage) {
    if (!PyType_Check(req_type) || !PyType_IsSubtype((PyTypeObject *)req_type, &PyTuple_Type) ||
        !PyTuple_Check(statuses) || PyTuple_GET_SIZE(statuses) != 4) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    return 0;
}

/* An int argument as a long long; out of range: `lo` / `hi` by its sign (a max_size beyond
 * every TOTALSIZE, an offset beyond every buffer). */
static int clamped_ll(PyObject *obj, long long *out) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = overflow > 0 ? LLONG_MAX : overflow < 0 ? LLONG_MIN : v;
    return 0;
}

/* check_record(buf, offset, check_crc, max_size, req_type, statuses) -> DispatchRequest */
static PyObject *sp_check_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char usage[] =
        "check_record(buf, offset: int, check_crc: bool, max_size: int, req_type, statuses)";
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (request_kinds(args[4], args[5], usage) < 0) return NULL;
    PyTypeObject *req_type = (PyTypeObject *)args[4];
    PyObject *statuses = args[5];
    long long offset, max_size;
    if (clamped_ll(args[1], &offset) < 0 || clamped_ll(args[3], &max_size) < 0) return NULL;
    int check_crc = PyObject_IsTrue(args[2]);
    if (check_crc < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *b = view.buf;
    Py_ssize_t end = view.len;
    rec_layout l = {0};
    int st;
    if (offset < 0)
        st = ST_INVALID;
    else if (offset >= end)
        st = ST_END;
    else
        st = check_layout(b, (Py_ssize_t)offset, end, check_crc, max_size, &l);
    PyObject *req = NULL;
    if (st == ST_OK) {
        PyObject *topic;
        int rc = utf8_text(b, l.topic_start, l.topic_end, &topic);
        if (rc > 0) {
            rc = ok_request(b, &l, req_type, PyTuple_GET_ITEM(statuses, ST_OK), topic, &req);
            Py_DECREF(topic);
        }
        if (rc < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        if (rc == 0) st = ST_INVALID;
    }
    if (req == NULL)
        req = plain_request(req_type, PyTuple_GET_ITEM(statuses, st), st == ST_BLANK ? l.total : 0);
    PyBuffer_Release(&view);
    return req;
}

/*
 * scan_records(buf, pos, base, file_from, file_size, check_crc, max_size, req_type, statuses)
 *   -> (requests, end, outcome)
 * RecordScanner's loop over `buf`, the bytes of one file from relative position `base` on,
 * starting at relative position `pos`: the valid records up to the first stop, `end` the
 * relative position after the last of them, and `outcome` the scanner's: BLANK, END or INVALID;
 * or None where the scanner would read the file again first (fewer than 8 bytes of a header
 * left, or a record longer than the bytes left while the file goes on): the caller reads from
 * `end` and takes that record as the reference does, then calls again.
 */
static PyObject *sp_scan_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char usage[] =
        "scan_records(buf, pos: int, base: int, file_from: int, file_size: int, check_crc: bool, "
        "max_size: int, req_type, statuses)";
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (request_kinds(args[7], args[8], usage) < 0) return NULL;
    PyTypeObject *req_type = (PyTypeObject *)args[7];
    PyObject *statuses = args[8];
    long long pos, base, file_from, file_size, max_size;
    if (get_ll(args[1], 0, I64_MAX, &pos, NULL, "pos") < 0 ||
        get_ll(args[2], 0, I64_MAX / 2, &base, NULL, "base") < 0 ||
        get_ll(args[3], I64_MIN, I64_MAX, &file_from, NULL, "file_from") < 0 ||
        get_ll(args[4], 0, I64_MAX / 2, &file_size, NULL, "file_size") < 0 ||
        clamped_ll(args[6], &max_size) < 0)
        return NULL;
    int check_crc = PyObject_IsTrue(args[5]);
    if (check_crc < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *b = view.buf;
    Py_ssize_t len = view.len;
    if (pos < base || pos - base > len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan_records: pos outside the buffer");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    PyObject *topic = NULL; /* the last topic decoded, with its raw bytes */
    const unsigned char *topic_raw = NULL;
    Py_ssize_t topic_len = -1;
    int outcome = -1; /* -1: read again at `pos` */
    if (out == NULL) goto fail;
    for (;;) {
        /* pos <= base + len, base and file_size <= I64_MAX / 2, len and total far below:
         * no sum below overflows */
        if (pos + BLANK_RECORD_SIZE > file_size) {
            outcome = pos >= file_size ? ST_END : ST_INVALID;
            break;
        }
        Py_ssize_t i = (Py_ssize_t)(pos - base);
        Py_ssize_t left = len - i;
        if (left < 8) break;
        int32_t total = (int32_t)get_be32(b + i);
        if (get_be32(b + i + 4) == BLANK_MAGIC_CODE) {
            /* the padding must run exactly to the end of the file */
            int whole = pos + total == file_size && total >= BLANK_RECORD_SIZE;
            outcome = whole ? ST_BLANK : ST_INVALID;
            break;
        }
        if (total > 0 && total <= max_size && left < total && base + len < file_size) break;
        rec_layout l;
        int st = check_layout(b, i, len, check_crc, max_size, &l);
        if (st != ST_OK) {
            outcome = st == ST_END ? ST_END : ST_INVALID;
            break;
        }
        long long own;
        if (__builtin_add_overflow(file_from, pos, &own) || get_be64s(b + i + 28) != own ||
            pos + l.total > file_size || torn_tail(b, &l)) {
            outcome = ST_INVALID;
            break;
        }
        Py_ssize_t tlen = l.topic_end - l.topic_start;
        if (topic == NULL || tlen != topic_len || memcmp(topic_raw, b + l.topic_start, tlen) != 0) {
            PyObject *t;
            int rc = utf8_text(b, l.topic_start, l.topic_end, &t);
            if (rc < 0) goto fail;
            if (rc == 0) {
                outcome = ST_INVALID;
                break;
            }
            Py_XSETREF(topic, t);
            topic_raw = b + l.topic_start;
            topic_len = tlen;
        }
        PyObject *req;
        int rc = ok_request(b, &l, req_type, PyTuple_GET_ITEM(statuses, ST_OK), topic, &req);
        if (rc < 0) goto fail;
        if (rc == 0) {
            outcome = ST_INVALID;
            break;
        }
        rc = PyList_Append(out, req);
        Py_DECREF(req);
        if (rc < 0) goto fail;
        pos += l.total;
    }
    Py_XDECREF(topic);
    PyBuffer_Release(&view);
    PyObject *end = PyLong_FromLongLong(pos);
    PyObject *result = end != NULL ? PyTuple_New(3) : NULL;
    if (result == NULL) {
        Py_XDECREF(end);
        Py_DECREF(out);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, out);
    PyTuple_SET_ITEM(result, 1, end);
    PyObject *status = outcome < 0 ? Py_None : PyTuple_GET_ITEM(statuses, outcome);
    PyTuple_SET_ITEM(result, 2, Py_NewRef(status));
    return result;
fail:
    Py_XDECREF(topic);
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------ UNIQ_KEY generator */
/* UniqKeys(prefix, month_start, month_end, counter): the state of common.message.UniqKeyGenerator
 * (its reference, the same keys for the same clock readings). Each call holds the GIL from start
 * to end and calls no Python code, so no lock is needed for threads. The clock is
 * CLOCK_REALTIME in whole ms, as int(time.time() * 1000). When the reading leaves
 * [month_start, month_end), next() and next_many() return None: the caller computes the new
 * local month (localtime, in Python) and passes it to set_month(). */
#include <time.h>

typedef struct {
    PyObject_HEAD
    PyObject *prefix; /* ASCII str (upper-case hex) */
    long long month_start, month_end, last_t;
    long count_in_t;
    unsigned counter; /* 16 bits */
} UniqKeys;

static const char HEX_UP[] = "0123456789ABCDEF";

static PyObject *uk_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *prefix;
    long long start, end;
    unsigned long counter;
    static char *kw[] = {"prefix", "month_start", "month_end", "counter", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ULLk", kw, &prefix, &start, &end, &counter))
        return NULL;
    if (PyUnicode_READY(prefix) < 0) return NULL;
    if (!PyUnicode_IS_ASCII(prefix)) {
        PyErr_SetString(PyExc_ValueError, "prefix must be ASCII");
        return NULL;
    }
    UniqKeys *self = (UniqKeys *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(prefix);
    self->prefix = prefix;
    self->month_start = start;
    self->month_end = end;
    self->last_t = -1;
    self->count_in_t = 0;
    self->counter = (unsigned)(counter & 0xFFFF);
    return (PyObject *)self;
}

static void uk_dealloc(UniqKeys *self) {
    Py_XDECREF(self->prefix);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static long long uk_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* prefix + the 12 hex digits of (t & 0xFFFFFFFF) << 16 | c. */
static PyObject *uk_format(UniqKeys *self, long long t, unsigned c) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(self->prefix);
    PyObject *out = PyUnicode_New(n + 12, 127);
    if (out == NULL) return NULL;
    Py_UCS1 *p = PyUnicode_1BYTE_DATA(out);
    memcpy(p, PyUnicode_1BYTE_DATA(self->prefix), (size_t)n);
    uint64_t v = ((uint64_t)(t & 0xFFFFFFFFLL) << 16) | (c & 0xFFFFu);
    for (int i = 11; i >= 0; i--) {
        p[n + i] = (Py_UCS1)HEX_UP[v & 0xF];
        v >>= 4;
    }
    return out;
}

static PyObject *uk_next(UniqKeys *self, PyObject *Py_UNUSED(ignored)) {
    long long now = uk_now_ms();
    if (now >= self->month_end || now < self->month_start) Py_RETURN_NONE;
    long long t = now - self->month_start;
    if (t > self->last_t) {
        self->last_t = t;
        self->count_in_t = 0;
    } else {
        t = self->last_t;
        if (self->count_in_t >= 0x10000) {
            t = self->last_t = t + 1;
            self->count_in_t = 0;
        }
    }
    self->count_in_t += 1;
    unsigned c = self->counter;
    self->counter = (c + 1) & 0xFFFF;
    return uk_format(self, t, c);
}

static PyObject *uk_next_many(UniqKeys *self, PyObject *arg) {
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) n = 0;
    long long now = uk_now_ms();
    if (now >= self->month_end || now < self->month_start) Py_RETURN_NONE;
    long long t = now - self->month_start;
    long count;
    if (t > self->last_t) {
        count = 0;
    } else {
        t = self->last_t;
        count = self->count_in_t;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    unsigned c = self->counter;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (count >= 0x10000) { /* this millisecond's counter values are used up */
            t += 1;
            count = 0;
        }
        PyObject *key = uk_format(self, t, c);
        if (key == NULL) {
            Py_DECREF(out);
            return NULL; /* the state is left as it was */
        }
        PyList_SET_ITEM(out, i, key);
        c = (c + 1) & 0xFFFF;
        count += 1;
    }
    if (n > 0) {
        self->last_t = t;
        self->count_in_t = count;
        self->counter = c;
    }
    return out;
}

static PyObject *uk_set_month(UniqKeys *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_month(month_start, month_end)");
        return NULL;
    }
    long long start = PyLong_AsLongLong(args[0]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    long long end = PyLong_AsLongLong(args[1]);
    if (end == -1 && PyErr_Occurred()) return NULL;
    if (start != self->month_start) {
        /* A new month (another thread may already have set it: then nothing changes). */
        self->month_start = start;
        self->month_end = end;
        self->last_t = -1;
    }
    Py_RETURN_NONE;
}

static PyMethodDef uk_methods[] = {
    {"next", (PyCFunction)uk_next, METH_NOARGS,
     "A new UNIQ_KEY, or None when the clock left the month (call set_month)."},
    {"next_many", (PyCFunction)uk_next_many, METH_O,
     "next_many(n): n new UNIQ_KEYs from one clock reading, or None (see next)."},
    {"set_month", (PyCFunction)(void (*)(void))uk_set_month, METH_FASTCALL,
     "set_month(month_start, month_end): the local month the clock is now in (epoch ms)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject UniqKeysType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "common.speedups.UniqKeys",
    .tp_basicsize = sizeof(UniqKeys),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "UniqKeyGenerator's state and its next() / next_many() (see common.message).",
    .tp_new = uk_new,
    .tp_dealloc = (destructor)uk_dealloc,
    .tp_methods = uk_methods,
};

/* ------------------------------------------------------------------ fsync worker */
/* `FsyncWorker`: the SYNC_FLUSH group commit's fsync thread, in C (store._flush says why).
 *
 * A POSIX thread takes rounds (file ranges to msync, or descriptors to fdatasync) in the order
 * they were submitted and syncs them without ever taking the GIL; each finished round is put on
 * a done list and an eventfd is signalled, which the event loop waits on. A round not yet taken
 * may still be extended (its ranges replaced). The state the thread uses lives in a block of
 * its own, freed by whichever of the thread and the Python object lets go of it last, so the
 * object may be collected while the thread finishes a round. */
#ifdef __linux__
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    uintptr_t addr; /* 0: fdatasync(fd) */
    size_t len;
    int fd;
} fw_range_t;

typedef struct fw_round {
    long long id;
    fw_range_t *ranges;
    Py_ssize_t n;
    int err;
    struct fw_round *next;
} fw_round_t;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fw_round_t *qhead, *qtail; /* submitted, not taken: oldest first */
    fw_round_t *dhead, *dtail; /* synced, not collected: oldest first */
    int stopping;
    int refs; /* the Python object, and the thread while it runs (under mu) */
    int efd;
} fw_shared_t;

typedef struct {
    PyObject_HEAD
    fw_shared_t *sh;
    int started;
} FsyncWorker;

static void fw_free_list(fw_round_t *r) {
    while (r != NULL) {
        fw_round_t *next = r->next;
        free(r->ranges);
        free(r);
        r = next;
    }
}

/* Drop one reference; called with mu held, returns with it released. */
static void fw_release(fw_shared_t *sh) {
    int last = --sh->refs == 0;
    pthread_mutex_unlock(&sh->mu);
    if (!last) return;
    fw_free_list(sh->qhead);
    fw_free_list(sh->dhead);
    close(sh->efd);
    pthread_cond_destroy(&sh->cv);
    pthread_mutex_destroy(&sh->mu);
    free(sh);
}

static void *fw_main(void *arg) {
    fw_shared_t *sh = (fw_shared_t *)arg;
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        while (sh->qhead == NULL && !sh->stopping) pthread_cond_wait(&sh->cv, &sh->mu);
        fw_round_t *r = sh->qhead;
        if (r == NULL) break; /* stopping, and every round submitted before is done */
        sh->qhead = r->next;
        if (sh->qhead == NULL) sh->qtail = NULL;
        r->next = NULL;
        pthread_mutex_unlock(&sh->mu);
        int err = 0;
        for (Py_ssize_t i = 0; i < r->n; i++) {
            fw_range_t *g = &r->ranges[i];
            int rc = g->addr ? msync((void *)g->addr, g->len, MS_SYNC) : fdatasync(g->fd);
            if (rc != 0) {
                err = errno;
                break;
            }
        }
        r->err = err;
        pthread_mutex_lock(&sh->mu);
        if (sh->dtail != NULL)
            sh->dtail->next = r;
        else
            sh->dhead = r;
        sh->dtail = r;
        uint64_t one = 1;
        if (write(sh->efd, &one, sizeof one) < 0) { /* EAGAIN: the counter is set already */
        }
    }
    fw_release(sh);
    return NULL;
}

/* A list of (address, length, fd) tuples as a malloc'd array; -1 with an exception set. */
static int fw_parse_ranges(PyObject *obj, fw_range_t **out, Py_ssize_t *n_out) {
    PyObject *seq = PySequence_Fast(obj, "ranges must be a sequence of (address, length, fd)");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    fw_range_t *ranges = (fw_range_t *)malloc(sizeof(fw_range_t) * (size_t)(n > 0 ? n : 1));
    if (ranges == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        unsigned long long addr, len;
        int fd;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "KKi", &addr, &len, &fd)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a range is a tuple (address, length, fd)");
            free(ranges);
            Py_DECREF(seq);
            return -1;
        }
        ranges[i].addr = (uintptr_t)addr;
        ranges[i].len = (size_t)len;
        ranges[i].fd = fd;
    }
    Py_DECREF(seq);
    *out = ranges;
    *n_out = n;
    return 0;
}

static PyObject *fw_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (!_PyArg_NoPositional("FsyncWorker", args) || !_PyArg_NoKeywords("FsyncWorker", kwds))
        return NULL;
    FsyncWorker *self = (FsyncWorker *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    fw_shared_t *sh = (fw_shared_t *)calloc(1, sizeof(fw_shared_t));
    if (sh == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    sh->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (sh->efd < 0) {
        free(sh);
        Py_DECREF(self);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    pthread_mutex_init(&sh->mu, NULL);
    pthread_cond_init(&sh->cv, NULL);
    sh->refs = 1;
    self->sh = sh;
    return (PyObject *)self;
}

static void fw_dealloc(FsyncWorker *self) {
    fw_shared_t *sh = self->sh;
    if (sh != NULL) {
        pthread_mutex_lock(&sh->mu);
        sh->stopping = 1;
        pthread_cond_signal(&sh->cv);
        fw_release(sh);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *fw_start(FsyncWorker *self, PyObject *Py_UNUSED(ignored)) {
    fw_shared_t *sh = self->sh;
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "the fsync worker was started already");
        return NULL;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t tid;
    pthread_mutex_lock(&sh->mu);
    sh->refs++;
    int rc = pthread_create(&tid, &attr, fw_main, sh);
    if (rc != 0) sh->refs--;
    pthread_mutex_unlock(&sh->mu);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    pthread_setname_np(tid, "trimq-fsync");
    self->started = 1;
    Py_RETURN_NONE;
}

/* The (round_id, ranges) arguments of `submit` and `extend`; -1 with an exception set. */
static int fw_round_args(const char *signature, PyObject *const *args, Py_ssize_t nargs,
                         long long *id, fw_range_t **ranges, Py_ssize_t *n) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, signature);
        return -1;
    }
    *id = PyLong_AsLongLong(args[0]);
    if (*id == -1 && PyErr_Occurred()) return -1;
    return fw_parse_ranges(args[1], ranges, n);
}

static PyObject *fw_submit(FsyncWorker *self, PyObject *const *args, Py_ssize_t nargs) {
    long long id;
    fw_range_t *ranges;
    Py_ssize_t n;
    if (fw_round_args("submit(round_id, ranges)", args, nargs, &id, &ranges, &n) < 0) return NULL;
    fw_round_t *r = (fw_round_t *)calloc(1, sizeof(fw_round_t));
    if (r == NULL) {
        free(ranges);
        return PyErr_NoMemory();
    }
    r->id = id;
    r->ranges = ranges;
    r->n = n;
    fw_shared_t *sh = self->sh;
    pthread_mutex_lock(&sh->mu);
    if (sh->stopping) {
        pthread_mutex_unlock(&sh->mu);
        fw_free_list(r);
        PyErr_SetString(PyExc_RuntimeError, "the fsync worker is stopped");
        return NULL;
    }
    if (sh->qtail != NULL)
        sh->qtail->next = r;
    else
        sh->qhead = r;
    sh->qtail = r;
    pthread_cond_signal(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    Py_RETURN_NONE;
}

static PyObject *fw_extend(FsyncWorker *self, PyObject *const *args, Py_ssize_t nargs) {
    long long id;
    fw_range_t *ranges;
    Py_ssize_t n;
    if (fw_round_args("extend(round_id, ranges)", args, nargs, &id, &ranges, &n) < 0) return NULL;
    fw_shared_t *sh = self->sh;
    fw_range_t *old = ranges;
    int found = 0;
    pthread_mutex_lock(&sh->mu);
    for (fw_round_t *r = sh->qhead; r != NULL; r = r->next) {
        if (r->id == id) {
            old = r->ranges;
            r->ranges = ranges;
            r->n = n;
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&sh->mu);
    free(old);
    return PyBool_FromLong(found);
}

static PyObject *fw_collect(FsyncWorker *self, PyObject *Py_UNUSED(ignored)) {
    fw_shared_t *sh = self->sh;
    uint64_t count;
    if (read(sh->efd, &count, sizeof count) < 0 && errno != EAGAIN)
        return PyErr_SetFromErrno(PyExc_OSError);
    pthread_mutex_lock(&sh->mu);
    fw_round_t *done = sh->dhead;
    sh->dhead = sh->dtail = NULL;
    pthread_mutex_unlock(&sh->mu);
    PyObject *out = PyList_New(0);
    for (fw_round_t *r = done; r != NULL && out != NULL; r = r->next) {
        PyObject *item = Py_BuildValue("(Li)", r->id, r->err);
        if (item == NULL || PyList_Append(out, item) < 0) Py_CLEAR(out);
        Py_XDECREF(item);
    }
    fw_free_list(done);
    return out;
}

static PyObject *fw_fileno(FsyncWorker *self, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLong(self->sh->efd);
}

static PyObject *fw_stop(FsyncWorker *self, PyObject *Py_UNUSED(ignored)) {
    fw_shared_t *sh = self->sh;
    pthread_mutex_lock(&sh->mu);
    sh->stopping = 1;
    pthread_cond_signal(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    Py_RETURN_NONE;
}

static PyMethodDef fw_methods[] = {
    {"start", (PyCFunction)fw_start, METH_NOARGS, "Start the thread (once)."},
    {"submit", (PyCFunction)(void (*)(void))fw_submit, METH_FASTCALL,
     "submit(round_id, ranges): queue a round of (address, length, fd) ranges; address 0 "
     "means fdatasync(fd)."},
    {"extend", (PyCFunction)(void (*)(void))fw_extend, METH_FASTCALL,
     "extend(round_id, ranges) -> bool: replace a queued round's ranges if the thread has not "
     "taken it yet."},
    {"collect", (PyCFunction)fw_collect, METH_NOARGS,
     "The rounds synced since the last call, oldest first: [(round_id, errno)], errno 0 on "
     "success; resets the eventfd."},
    {"fileno", (PyCFunction)fw_fileno, METH_NOARGS,
     "The eventfd that becomes readable when a round is done."},
    {"stop", (PyCFunction)fw_stop, METH_NOARGS,
     "No more rounds: the thread exits once the queued ones are synced."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FsyncWorkerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "common.speedups.FsyncWorker",
    .tp_basicsize = sizeof(FsyncWorker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The group commit's fsync thread (no GIL while it syncs or signals).",
    .tp_new = fw_new,
    .tp_dealloc = (destructor)fw_dealloc,
    .tp_methods = fw_methods,
};
#endif /* __linux__ */

/* ------------------------------------------------------------------ columnar decode */
/* A growable byte buffer for the columns below. */
typedef struct {
    char *p;
    Py_ssize_t len, cap;
} gbuf;

static int gb_reserve(gbuf *g, Py_ssize_t more) {
    if (g->len + more <= g->cap) return 0;
    Py_ssize_t cap = g->cap ? g->cap : 256;
    while (cap < g->len + more) cap *= 2;
    char *p = PyMem_Realloc(g->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g->p = p;
    g->cap = cap;
    return 0;
}

static inline int gb_put(gbuf *g, const void *src, Py_ssize_t n) {
    if (gb_reserve(g, n) < 0) return -1;
    memcpy(g->p + g->len, src, (size_t)n);
    g->len += n;
    return 0;
}

/* Arrow buffers are little-endian. */
static inline int gb_le32(gbuf *g, int32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    return gb_put(g, b, 4);
}

static inline int gb_le64(gbuf *g, int64_t v) {
    uint64_t u = (uint64_t)v;
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(u >> (8 * i));
    return gb_put(g, b, 8);
}

/* Validity bitmap (LSB first): bit `i` set when `valid`. */
static inline int gb_bit(gbuf *g, Py_ssize_t i, int valid) {
    if ((i & 7) == 0 && gb_put(g, "\0", 1) < 0) return -1;
    if (valid) g->p[i >> 3] |= (char)(1 << (i & 7));
    return 0;
}

/* The columns, in the order of the tuple `decode_records_columns` returns after the count. */
enum {
    C_QOFF, C_BORN, C_STORE, C_BODY_OFF, C_BODY, C_MID_OFF, C_MID, C_KEYS_VALID, C_KEYS_OFF,
    C_KEYS, C_TAGS_VALID, C_TAGS_OFF, C_TAGS, C_PROP_OFF, C_PKEY_OFF, C_PKEY, C_PVAL_OFF, C_PVAL,
    C_N
};

/* A nullable string column taken from one property value (or null). */
static int put_opt_str(gbuf *c, Py_ssize_t row, const unsigned char *v, Py_ssize_t n) {
    gbuf *valid = c, *off = c + 1, *data = c + 2;
    if (gb_bit(valid, row, v != NULL) < 0) return -1;
    if (v != NULL && gb_put(data, v, n) < 0) return -1;
    return gb_le32(off, (int32_t)data->len);
}

/*
 * decode_records_columns(buf: bytes, end: int) -> tuple | None
 * The records of a pull body whose queue offset is below `end`, as Arrow buffers (see
 * common.message.decode_records_columns). None, with nothing raised, when the body needs the
 * Python decoder: a record that fails a check, IPv6 hosts, a compressed body, properties that
 * are not ASCII or name a key twice.
 */
static PyObject *sp_decode_records_columns(PyObject *self, PyObject *const *args,
                                           Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "decode_records_columns(buf: bytes, end: int)");
        return NULL;
    }
    long long end_offset = PyLong_AsLongLong(args[1]);
    if (end_offset == -1 && PyErr_Occurred()) return NULL;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t end = PyBytes_GET_SIZE(args[0]);
    gbuf c[C_N];
    memset(c, 0, sizeof(c));
    PyObject *result = NULL;
    int fallback = 0;
    Py_ssize_t n = 0;
    if (gb_reserve(&c[C_BODY], end) < 0) goto done;
    if (gb_le32(&c[C_BODY_OFF], 0) < 0 || gb_le32(&c[C_MID_OFF], 0) < 0 ||
        gb_le32(&c[C_KEYS_OFF], 0) < 0 || gb_le32(&c[C_TAGS_OFF], 0) < 0 ||
        gb_le32(&c[C_PROP_OFF], 0) < 0 || gb_le32(&c[C_PKEY_OFF], 0) < 0 ||
        gb_le32(&c[C_PVAL_OFF], 0) < 0)
        goto done;
    Py_ssize_t offset = 0;
    while (offset < end) {
        record_view rv;
        if (plain_record(b, offset, end, &rv) < 0) goto fall;
        const unsigned char *r = rv.r;
        int64_t qoff = get_be64s(r + 20);
        if (qoff >= end_offset) break;
        int32_t body_len = rv.body_len;
        Py_ssize_t rec_end = rv.rec_end, pos = rv.body_start, props_start = rv.props_start;
        /* Properties: "name\x01value\x02...", segments without a name or value skipped (as
         * decode_properties). Up to 64 per record are checked for a repeated name. */
        const unsigned char *uniq = NULL, *keys = NULL, *tags = NULL;
        Py_ssize_t uniq_n = 0, keys_n = 0, tags_n = 0;
        const unsigned char *seen[64];
        Py_ssize_t seen_n[64];
        int nseen = 0;
        Py_ssize_t s = props_start;
        while (s <= rec_end) {
            Py_ssize_t e = s, sep = -1;
            while (e < rec_end && b[e] != 2) {
                if (b[e] & 0x80) goto fall; /* non-ASCII: the Python path checks the UTF-8 */
                if (b[e] == 1 && sep < 0) sep = e;
                e++;
            }
            if (sep > s && sep + 1 < e) {
                const unsigned char *k = b + s, *v = b + sep + 1;
                Py_ssize_t kn = sep - s, vn = e - sep - 1;
                if (nseen == 64) goto fall;
                for (int i = 0; i < nseen; i++)
                    if (seen_n[i] == kn && memcmp(seen[i], k, (size_t)kn) == 0) goto fall;
                seen[nseen] = k;
                seen_n[nseen++] = kn;
                if (kn == 8 && memcmp(k, "UNIQ_KEY", 8) == 0) {
                    uniq = v;
                    uniq_n = vn;
                } else if (kn == 4 && memcmp(k, "KEYS", 4) == 0) {
                    keys = v;
                    keys_n = vn;
                } else if (kn == 4 && memcmp(k, "TAGS", 4) == 0) {
                    tags = v;
                    tags_n = vn;
                }
                if (gb_put(&c[C_PKEY], k, kn) < 0 ||
                    gb_le32(&c[C_PKEY_OFF], (int32_t)c[C_PKEY].len) < 0 ||
                    gb_put(&c[C_PVAL], v, vn) < 0 ||
                    gb_le32(&c[C_PVAL_OFF], (int32_t)c[C_PVAL].len) < 0)
                    goto done;
            }
            s = e + 1;
        }
        if (gb_le32(&c[C_PROP_OFF], (int32_t)(c[C_PKEY_OFF].len / 4 - 1)) < 0) goto done;
        if (gb_le64(&c[C_QOFF], qoff) < 0 ||
            gb_le64(&c[C_BORN], get_be64s(r + 40) * 1000) < 0 || /* ms -> us */
            gb_le64(&c[C_STORE], get_be64s(r + 56) * 1000) < 0 ||
            gb_put(&c[C_BODY], b + pos, body_len) < 0 ||
            gb_le32(&c[C_BODY_OFF], (int32_t)c[C_BODY].len) < 0)
            goto done;
        if (uniq != NULL) {
            if (gb_put(&c[C_MID], uniq, uniq_n) < 0) goto done;
        } else { /* the offset message id: store ip, port (big-endian) and commitlog offset */
            char hex[32];
            const unsigned char *host = r + 64; /* 4-byte ip then 4-byte port */
            for (int i = 0; i < 8; i++) {
                hex[2 * i] = HEX_UP[host[i] >> 4];
                hex[2 * i + 1] = HEX_UP[host[i] & 15];
            }
            uint64_t phy = (uint64_t)get_be64s(r + 28);
            for (int i = 0; i < 16; i++) hex[16 + i] = HEX_UP[(phy >> (60 - 4 * i)) & 15];
            if (gb_put(&c[C_MID], hex, 32) < 0) goto done;
        }
        if (gb_le32(&c[C_MID_OFF], (int32_t)c[C_MID].len) < 0 ||
            put_opt_str(&c[C_KEYS_VALID], n, keys, keys_n) < 0 ||
            put_opt_str(&c[C_TAGS_VALID], n, tags, tags_n) < 0)
            goto done;
        n++;
        offset = rec_end;
    }
    {
        PyObject *t = PyTuple_New(C_N + 1);
        if (t == NULL) goto done;
        PyObject *cnt = PyLong_FromSsize_t(n);
        if (cnt == NULL) {
            Py_DECREF(t);
            goto done;
        }
        PyTuple_SET_ITEM(t, 0, cnt);
        for (int i = 0; i < C_N; i++) {
            PyObject *v = PyBytes_FromStringAndSize(c[i].p ? c[i].p : "", c[i].len);
            if (v == NULL) {
                Py_DECREF(t);
                goto done;
            }
            PyTuple_SET_ITEM(t, i + 1, v);
        }
        result = t;
    }
    goto done;
fall:
    fallback = 1;
done:
    for (int i = 0; i < C_N; i++) PyMem_Free(c[i].p);
    if (fallback) Py_RETURN_NONE;
    return result;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"crc32", (PyCFunction)(void (*)(void))sp_crc32, METH_FASTCALL,
     "crc32(data, value=0): zlib.crc32 (IEEE polynomial)."},
    {"java_string_hash", sp_java_string_hash, METH_O, "Java String.hashCode() as an int32."},
    {"key_hash2", (PyCFunction)(void (*)(void))sp_key_hash2, METH_FASTCALL,
     "key_hash2(prefix, key): the index hash of prefix + key."},
    {"decode_properties", sp_decode_properties, METH_O, "RocketMQ properties string -> dict."},
    {"encode_records", (PyCFunction)(void (*)(void))sp_encode_records, METH_FASTCALL,
     "Encode messages back to back (see common.message.encode_records)."},
    {"patch_records", (PyCFunction)(void (*)(void))sp_patch_records, METH_FASTCALL,
     "Write queue offsets, physical offsets and store timestamps (common.message)."},
    {"offset_msg_ids", (PyCFunction)(void (*)(void))sp_offset_msg_ids, METH_FASTCALL,
     "Offset message ids of commitlog offsets on one store host."},
    {"pack_cq_units", (PyCFunction)(void (*)(void))sp_pack_cq_units, METH_FASTCALL,
     "Consume-queue units ('>qiq') of parallel sequences."},
    {"index_hashes", (PyCFunction)(void (*)(void))sp_index_hashes, METH_FASTCALL,
     "Index key hashes of a batch (store.index_file)."},
    {"index_put_hashes", (PyCFunction)(void (*)(void))sp_index_put_hashes, METH_FASTCALL,
     "Write index entries and slots into a mapped index file."},
    {"decode_batch_body", (PyCFunction)(void (*)(void))sp_decode_batch_body, METH_FASTCALL,
     "Split a SEND_BATCH_MESSAGE body (common.message.decode_batch_body)."},
    {"build_batch_messages", (PyCFunction)(void (*)(void))sp_build_batch_messages,
     METH_FASTCALL, "The per-message loop of SendProcessor.send_batch."},
    {"decode_records_into", (PyCFunction)(void (*)(void))sp_decode_records_into, METH_FASTCALL,
     "A pull body's records as new objects of a slotted class (None: use the Python decoder)."},
    {"decode_records_columns", (PyCFunction)(void (*)(void))sp_decode_records_columns,
     METH_FASTCALL, "A pull body's records as Arrow column buffers (None: use Python)."},
    {"check_record", (PyCFunction)(void (*)(void))sp_check_record, METH_FASTCALL,
     "The DispatchRequest of the record at an offset (common.message.check_record)."},
    {"scan_records", (PyCFunction)(void (*)(void))sp_scan_records, METH_FASTCALL,
     "RecordScanner's loop over a buffer: (requests, end, outcome or None)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "common.speedups",
    "Native accelerators of the message codec and the store.", 0, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_speedups(void) {
    crc_init();
#ifdef HAVE_CLMUL_CRC
    __builtin_cpu_init();
    use_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    if (intern_names() < 0 || intern_record_slots() < 0) return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod != NULL && (PyType_Ready(&UniqKeysType) < 0 ||
                        PyModule_AddObjectRef(mod, "UniqKeys", (PyObject *)&UniqKeysType) < 0))
        Py_CLEAR(mod);
#ifdef __linux__
    if (mod != NULL && (PyType_Ready(&FsyncWorkerType) < 0 ||
                        PyModule_AddObjectRef(mod, "FsyncWorker", (PyObject *)&FsyncWorkerType) < 0))
        Py_CLEAR(mod);
#endif
    return mod;
}
