/* remoting._speedups: native frame codec, msgpack (0x6D) and ROCKETMQ binary (1) header codecs,
 * and the typed-header extFields decoder.
 *
 * The pure-Python code in remoting/_frame.py, remoting/_header_codec.py and
 * remoting/protocol/headers.py is the reference. This module handles the common case natively
 * and hands everything else to the Python functions given to `setup()`:
 *
 * - parse_frames(src, max_len, out): the frame loop of FrameDecoder (length prefix, header word,
 *   bounds checks, body slice); msgpack and ROCKETMQ headers are decoded here, JSON headers and
 *   any header that is malformed or outside the subset below go to the Python decoder, which then
 *   also gives the authoritative FrameError.
 * - decode_header(serialize_type, data), encode_header(cmd), encode_frame_parts(cmd): msgpack,
 *   ROCKETMQ and JSON headers natively (JSON decode: the subset fastjson writes, see below).
 *
 * The msgpack subset: a 7-element array of five integers (int64 range), a nil or str remark and
 * a nil or map of str to str; nothing after the array. Anything else (longer arrays, non-UTF-8,
 * other types, unsigned values above int64) falls back to Python.
 *
 * RemotingCommand is a __slots__ class; setup() reads the offsets of its slots from their member
 * descriptors, so commands are created with tp_alloc and filled by direct slot stores (what
 * `object.__new__` + attribute stores do in remoting._command.new_command, minus the lookups).
 *
 * Module state (the class, its slot offsets, the fallbacks, the exception classes) is written only
 * by setup(), which remoting._header_codec calls once at import.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#define MSGPACK_TYPE 0x6D
#define JSON_TYPE 0
#define MAX_HEADER_LEN 0xFFFFFF

enum { S_BODY, S_CODE, S_EXT, S_FLAG, S_LANGUAGE, S_OPAQUE, S_REMARK, S_STYPE, S_VERSION, S_COUNT };
static const char *const slot_names[S_COUNT] = {
    "body", "code", "ext_fields", "flag", "language", "opaque", "remark", "serialize_type", "version",
};

typedef struct {
    PyTypeObject *cmd_type;
    Py_ssize_t off[S_COUNT];
    PyObject *py_decode_header;  /* (serialize_type, bytes) -> RemotingCommand */
    PyObject *py_encode_header;  /* (cmd) -> bytes */
    PyObject *frame_error;
    PyObject *too_large_error;
    PyObject *msgpack_type;      /* int 0x6D */
    uint64_t lang_valid;         /* bit i set: language i is known */
    PyObject *lang_other;        /* int */
    long long lang_other_value;
    PyObject *lang_names;        /* tuple: language code -> ASCII name (str) or None */
} modstate;

static inline modstate *get_state(PyObject *module) { return (modstate *)PyModule_GetState(module); }

static int check_ready(modstate *st) {
    if (st->cmd_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "remoting._speedups.setup() has not been called");
        return -1;
    }
    return 0;
}

#define SLOT(obj, st, i) (*(PyObject **)((char *)(obj) + (st)->off[i]))

/* ------------------------------------------------------------------------------------------ */
/* setup                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static PyObject *setup(PyObject *module, PyObject *args) {
    PyObject *cls, *py_dec, *py_enc, *ferr, *tlerr, *lang_valid, *lang_other, *lang_names;
    if (!PyArg_ParseTuple(args, "O!OOOOO!O!O!:setup", &PyType_Type, &cls, &py_dec, &py_enc, &ferr, &tlerr,
                          &PyTuple_Type, &lang_valid, &PyLong_Type, &lang_other, &PyTuple_Type, &lang_names))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(lang_names); i++) {
        PyObject *name = PyTuple_GET_ITEM(lang_names, i);
        if (name != Py_None && !(PyUnicode_CheckExact(name) && PyUnicode_IS_ASCII(name))) {
            PyErr_SetString(PyExc_TypeError, "setup: language names must be ASCII str or None");
            return NULL;
        }
    }
    PyTypeObject *tp = (PyTypeObject *)cls;
    Py_ssize_t off[S_COUNT];
    for (int i = 0; i < S_COUNT; i++) {
        PyObject *descr = PyDict_GetItemString(tp->tp_dict, slot_names[i]); /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%s has no __slots__ member %s", tp->tp_name, slot_names[i]);
            return NULL;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset < (Py_ssize_t)sizeof(PyObject) ||
            m->offset + (Py_ssize_t)sizeof(PyObject *) > tp->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a plain object slot", tp->tp_name, slot_names[i]);
            return NULL;
        }
        off[i] = m->offset;
    }
    if (!PyCallable_Check(py_dec) || !PyCallable_Check(py_enc)) {
        PyErr_SetString(PyExc_TypeError, "setup: the fallbacks must be callable");
        return NULL;
    }
    if (!PyType_Check(ferr) || !PyType_IsSubtype((PyTypeObject *)ferr, (PyTypeObject *)PyExc_Exception) ||
        !PyType_Check(tlerr) || !PyType_IsSubtype((PyTypeObject *)tlerr, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "setup: the errors must be exception classes");
        return NULL;
    }
    uint64_t mask = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(lang_valid); i++) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(lang_valid, i));
        if (v == -1 && PyErr_Occurred()) return NULL;
        if (v < 0 || v > 63) {
            PyErr_SetString(PyExc_ValueError, "setup: language codes must be in 0..63");
            return NULL;
        }
        mask |= (uint64_t)1 << v;
    }
    long long other = PyLong_AsLongLong(lang_other);
    if (other == -1 && PyErr_Occurred()) return NULL;
    PyObject *mtype = PyLong_FromLong(MSGPACK_TYPE);
    if (mtype == NULL) return NULL;

    modstate *st = get_state(module);
    Py_INCREF(cls);
    Py_XSETREF(st->cmd_type, tp);
    memcpy(st->off, off, sizeof(off));
    Py_INCREF(py_dec);
    Py_XSETREF(st->py_decode_header, py_dec);
    Py_INCREF(py_enc);
    Py_XSETREF(st->py_encode_header, py_enc);
    Py_INCREF(ferr);
    Py_XSETREF(st->frame_error, ferr);
    Py_INCREF(tlerr);
    Py_XSETREF(st->too_large_error, tlerr);
    Py_XSETREF(st->msgpack_type, mtype);
    Py_INCREF(lang_other);
    Py_XSETREF(st->lang_other, lang_other);
    st->lang_valid = mask;
    st->lang_other_value = other;
    Py_INCREF(lang_names);
    Py_XSETREF(st->lang_names, lang_names);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------ */
/* msgpack header decode (subset)                                                              */
/* ------------------------------------------------------------------------------------------ */

/* Readers return 1 on success, 0 when the input is outside the subset (fall back to Python). */

static inline uint16_t rd16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t rd32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static inline uint64_t rd64(const unsigned char *p) { return ((uint64_t)rd32(p) << 32) | rd32(p + 4); }

static int mp_int(const unsigned char *p, Py_ssize_t n, Py_ssize_t *pos, long long *out) {
    Py_ssize_t i = *pos;
    if (i >= n) return 0;
    unsigned char b = p[i++];
    Py_ssize_t need;
    if (b <= 0x7f) { *out = b; *pos = i; return 1; }
    if (b >= 0xe0) { *out = (long long)(signed char)b; *pos = i; return 1; }
    switch (b) {
    case 0xcc: case 0xd0: need = 1; break;
    case 0xcd: case 0xd1: need = 2; break;
    case 0xce: case 0xd2: need = 4; break;
    case 0xcf: case 0xd3: need = 8; break;
    default: return 0;
    }
    if (n - i < need) return 0;
    const unsigned char *q = p + i;
    switch (b) {
    case 0xcc: *out = q[0]; break;
    case 0xcd: *out = rd16(q); break;
    case 0xce: *out = rd32(q); break;
    case 0xcf: {
        uint64_t u = rd64(q);
        if (u > (uint64_t)INT64_MAX) return 0;
        *out = (long long)u;
        break;
    }
    case 0xd0: *out = (signed char)q[0]; break;
    case 0xd1: *out = (int16_t)rd16(q); break;
    case 0xd2: *out = (int32_t)rd32(q); break;
    default: *out = (long long)(int64_t)rd64(q); break;
    }
    *pos = i + need;
    return 1;
}

/* A str at *pos: sets *s, *len. Returns 1, or 0 if not a str / truncated. */
static int mp_str(const unsigned char *p, Py_ssize_t n, Py_ssize_t *pos, const char **s, Py_ssize_t *len) {
    Py_ssize_t i = *pos;
    if (i >= n) return 0;
    unsigned char b = p[i++];
    Py_ssize_t l;
    if ((b & 0xe0) == 0xa0) {
        l = b & 0x1f;
    } else if (b == 0xd9) {
        if (n - i < 1) return 0;
        l = p[i];
        i += 1;
    } else if (b == 0xda) {
        if (n - i < 2) return 0;
        l = rd16(p + i);
        i += 2;
    } else if (b == 0xdb) {
        if (n - i < 4) return 0;
        l = (Py_ssize_t)rd32(p + i);
        i += 4;
    } else {
        return 0;
    }
    if (l > n - i) return 0;
    *s = (const char *)p + i;
    *len = l;
    *pos = i + l;
    return 1;
}

/* Decode a UTF-8 string; NULL with no error set means "not UTF-8, fall back". */
static PyObject *utf8_or_fallback(const char *s, Py_ssize_t len) {
    PyObject *r = PyUnicode_DecodeUTF8(s, len, NULL);
    if (r == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear();
    return r;
}

static PyObject *new_command(modstate *st, PyObject *code, PyObject *opaque, PyObject *flag, PyObject *remark,
                             PyObject *ext, PyObject *language, PyObject *version, PyObject *stype) {
    /* Steals every reference (also on failure). */
    PyObject *cmd = st->cmd_type->tp_alloc(st->cmd_type, 0);
    if (cmd == NULL) {
        Py_DECREF(code); Py_DECREF(opaque); Py_DECREF(flag); Py_DECREF(remark);
        Py_DECREF(ext); Py_DECREF(language); Py_DECREF(version); Py_DECREF(stype);
        return NULL;
    }
    SLOT(cmd, st, S_CODE) = code;
    SLOT(cmd, st, S_OPAQUE) = opaque;
    SLOT(cmd, st, S_FLAG) = flag;
    SLOT(cmd, st, S_REMARK) = remark;
    SLOT(cmd, st, S_EXT) = ext;
    Py_INCREF(Py_None);
    SLOT(cmd, st, S_BODY) = Py_None;
    SLOT(cmd, st, S_LANGUAGE) = language;
    SLOT(cmd, st, S_VERSION) = version;
    SLOT(cmd, st, S_STYPE) = stype;
    return cmd;
}

/* `new_command` from C integers. Steals remark, ext, language and stype (any of the last two
 * may be NULL after a failed allocation: then NULL is returned, the error set). */
static PyObject *command_from_ints(modstate *st, long long code, long long opaque, long long flag,
                                   PyObject *remark, PyObject *ext, PyObject *language,
                                   long long version, PyObject *stype) {
    PyObject *c = PyLong_FromLongLong(code);
    PyObject *op = PyLong_FromLongLong(opaque);
    PyObject *fl = PyLong_FromLongLong(flag);
    PyObject *ve = PyLong_FromLongLong(version);
    if (!c || !op || !fl || !ve || !language || !stype) {
        Py_XDECREF(c); Py_XDECREF(op); Py_XDECREF(fl); Py_XDECREF(ve);
        Py_XDECREF(language); Py_XDECREF(stype); Py_DECREF(remark); Py_DECREF(ext);
        return NULL;
    }
    return new_command(st, c, op, fl, remark, ext, language, ve, stype);
}

/* NULL without an error: outside the subset, use the Python decoder. */
static PyObject *mp_decode(modstate *st, const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t pos = 0;
    if (n < 1) return NULL;
    unsigned char b = p[pos++];
    Py_ssize_t count;
    if ((b & 0xf0) == 0x90) count = b & 0x0f;
    else if (b == 0xdc && n >= 3) { count = rd16(p + 1); pos = 3; }
    else return NULL;
    if (count != 7) return NULL;
    long long v[5];
    for (int i = 0; i < 5; i++)
        if (!mp_int(p, n, &pos, &v[i])) return NULL;
    /* v: code, language, version, opaque, flag */
    PyObject *remark = NULL, *ext = NULL;
    if (pos >= n) return NULL;
    if (p[pos] == 0xc0) {
        pos++;
        remark = Py_NewRef(Py_None);
    } else {
        const char *s;
        Py_ssize_t len;
        if (!mp_str(p, n, &pos, &s, &len)) return NULL;
        remark = utf8_or_fallback(s, len);
        if (remark == NULL) return NULL;
    }
    if (pos >= n) goto fallback;
    b = p[pos++];
    if (b == 0xc0) {
        ext = Py_NewRef(Py_None);
    } else {
        Py_ssize_t entries;
        if ((b & 0xf0) == 0x80) entries = b & 0x0f;
        else if (b == 0xde) {
            if (n - pos < 2) goto fallback;
            entries = rd16(p + pos);
            pos += 2;
        } else if (b == 0xdf) {
            if (n - pos < 4) goto fallback;
            entries = (Py_ssize_t)rd32(p + pos);
            pos += 4;
        } else goto fallback;
        if (entries > (n - pos) / 2) goto fallback; /* each entry takes at least 2 bytes */
        /* Presized (no rehash while filling); capped so a hostile count cannot reserve much. */
        ext = _PyDict_NewPresized(entries < 64 ? entries : 64);
        if (ext == NULL) goto error;
        for (Py_ssize_t e = 0; e < entries; e++) {
            const char *ks, *vs;
            Py_ssize_t kl, vl;
            if (!mp_str(p, n, &pos, &ks, &kl) || !mp_str(p, n, &pos, &vs, &vl)) goto fallback;
            PyObject *key = utf8_or_fallback(ks, kl);
            if (key == NULL) goto fallback_or_error;
            PyObject *val = utf8_or_fallback(vs, vl);
            if (val == NULL) { Py_DECREF(key); goto fallback_or_error; }
            int rc = PyDict_SetItem(ext, key, val);
            Py_DECREF(key);
            Py_DECREF(val);
            if (rc < 0) goto error;
        }
    }
    if (pos != n) goto fallback;
    {
        long long lang = v[1];
        PyObject *code = PyLong_FromLongLong(v[0]);
        PyObject *language = (lang >= 0 && lang < 64 && (st->lang_valid >> lang) & 1)
                                 ? PyLong_FromLongLong(lang) : Py_NewRef(st->lang_other);
        PyObject *version = PyLong_FromLongLong(v[2]);
        PyObject *opaque = PyLong_FromLongLong(v[3]);
        PyObject *flag = PyLong_FromLongLong(v[4]);
        if (!code || !language || !version || !opaque || !flag) {
            Py_XDECREF(code); Py_XDECREF(language); Py_XDECREF(version); Py_XDECREF(opaque); Py_XDECREF(flag);
            goto error;
        }
        return new_command(st, code, opaque, flag, remark, ext, language, version, Py_NewRef(st->msgpack_type));
    }
fallback_or_error:
    if (PyErr_Occurred()) goto error;
fallback:
    Py_XDECREF(remark);
    Py_XDECREF(ext);
    return NULL;
error:
    Py_XDECREF(remark);
    Py_XDECREF(ext);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* ROCKETMQ binary header (type 1)                                                             */
/* ------------------------------------------------------------------------------------------ */
/* code int16, language u8, version int16, opaque int32, flag int32, remark (int32 length +
 * UTF-8), extFields (int32 length + entries of int16 key length, key, int32 value length, value).
 * Decoded here when well formed; any error (bounds, negative lengths, non-UTF-8, trailing bytes)
 * goes to the Python decoder for its FrameError. */
#define ROCKETMQ_TYPE 1

static PyObject *rq_decode(modstate *st, const unsigned char *p, Py_ssize_t n) {
    if (n < 21) return NULL;
    long long code = (int16_t)rd16(p), lang = p[2], version = (int16_t)rd16(p + 3);
    long long opaque = (int32_t)rd32(p + 5), flag = (int32_t)rd32(p + 9);
    Py_ssize_t pos = 13;
    int32_t remark_len = (int32_t)rd32(p + pos);
    pos += 4;
    PyObject *remark = NULL, *ext = NULL;
    if (remark_len != 0) {
        if (remark_len < 0 || remark_len > n - pos - 4) return NULL;
        remark = utf8_or_fallback((const char *)p + pos, remark_len);
        if (remark == NULL) return NULL;
        pos += remark_len;
    } else {
        remark = Py_NewRef(Py_None);
    }
    int32_t ext_len = (int32_t)rd32(p + pos);
    pos += 4;
    if (ext_len != 0) {
        if (ext_len < 0 || ext_len > n - pos) goto fallback;
        Py_ssize_t end = pos + ext_len;
        ext = PyDict_New();
        if (ext == NULL) goto error;
        while (pos < end) {
            if (end - pos < 2) goto fallback;
            Py_ssize_t klen = rd16(p + pos);
            if (klen & 0x8000) goto fallback;
            pos += 2;
            if (klen > end - pos - 4) goto fallback;
            const char *ks = (const char *)p + pos;
            int32_t vlen = (int32_t)rd32(p + pos + klen);
            pos += klen + 4;
            if (vlen < 0 || vlen > end - pos) goto fallback;
            PyObject *key = utf8_or_fallback(ks, klen);
            if (key == NULL) goto fallback_or_error;
            PyObject *val = utf8_or_fallback((const char *)p + pos, vlen);
            if (val == NULL) { Py_DECREF(key); goto fallback_or_error; }
            pos += vlen;
            int rc = PyDict_SetItem(ext, key, val);
            Py_DECREF(key);
            Py_DECREF(val);
            if (rc < 0) goto error;
        }
    } else {
        ext = Py_NewRef(Py_None);
    }
    if (pos != n) goto fallback;
    {
        PyObject *language = (lang < 64 && (st->lang_valid >> lang) & 1) ? PyLong_FromLongLong(lang)
                                                                      : Py_NewRef(st->lang_other);
        return command_from_ints(st, code, opaque, flag, remark, ext, language, version,
                                 PyLong_FromLong(ROCKETMQ_TYPE));
    }
fallback_or_error:
    if (PyErr_Occurred()) goto error;
fallback:
error:
    Py_XDECREF(remark);
    Py_XDECREF(ext);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* JSON header decode (type 0), the subset fastjson writes                                    */
/* ------------------------------------------------------------------------------------------ */
/* One object; known keys code/flag/opaque/version (int or null), language (name, int or null),
 * remark (str or null), extFields (null, or an object whose values are strings, integers,
 * true/false or null: see j_ext_value); other keys with a string, integer or null value are
 * ignored (as _decode_json ignores them). Anything else (floats, true/false outside extFields,
 * arrays, nested values elsewhere, bad escapes, raw control characters, non-UTF-8, big numbers,
 * trailing data) goes to json.loads in Python, which also handles the lenient forms. */

typedef struct {
    const unsigned char *p;
    Py_ssize_t n, pos;
} jcur;

static inline void j_ws(jcur *c) {
    while (c->pos < c->n) {
        unsigned char b = c->p[c->pos];
        if (b != ' ' && b != '\t' && b != '\n' && b != '\r') break;
        c->pos++;
    }
}

static inline int hexval(unsigned char b) {
    if (b >= '0' && b <= '9') return b - '0';
    if (b >= 'a' && b <= 'f') return b - 'a' + 10;
    if (b >= 'A' && b <= 'F') return b - 'A' + 10;
    return -1;
}

static int j_u4(jcur *c, Py_ssize_t at, Py_UCS4 *out) {
    if (c->n - at < 4) return 0;
    Py_UCS4 v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(c->p[at + i]);
        if (h < 0) return 0;
        v = (v << 4) | (Py_UCS4)h;
    }
    *out = v;
    return 1;
}

/* A string at c->pos (which is '"'). Returns a new str, or NULL: fallback if no error set. */
static PyObject *j_str(jcur *c) {
    Py_ssize_t start = ++c->pos;
    int simple = 1;
    while (c->pos < c->n) {
        unsigned char b = c->p[c->pos];
        if (b == '"') break;
        if (b < 0x20) return NULL;
        if (b == '\\') {
            simple = 0;
            c->pos += 2;
            continue;
        }
        c->pos++;
    }
    if (c->pos >= c->n) return NULL;
    Py_ssize_t end = c->pos++;
    if (simple) return utf8_or_fallback((const char *)c->p + start, end - start);
    /* With escapes: decode into a UCS4 buffer (at most one code point per input byte). */
    Py_UCS4 *buf = PyMem_Malloc(sizeof(Py_UCS4) * (size_t)(end - start + 1));
    if (buf == NULL) { PyErr_NoMemory(); return NULL; }
    Py_ssize_t o = 0, i = start;
    PyObject *res = NULL;
    while (i < end) {
        unsigned char b = c->p[i];
        if (b != '\\') {
            /* A run of plain bytes: decode it as UTF-8. */
            Py_ssize_t j = i;
            while (j < end && c->p[j] != '\\') j++;
            PyObject *part = utf8_or_fallback((const char *)c->p + i, j - i);
            if (part == NULL) goto done;
            Py_ssize_t len = PyUnicode_GET_LENGTH(part);
            if (PyUnicode_AsUCS4(part, buf + o, end - start + 1 - o, 0) == NULL) { Py_DECREF(part); goto done; }
            Py_DECREF(part);
            o += len;
            i = j;
            continue;
        }
        if (i + 1 >= end) goto done;
        unsigned char e = c->p[i + 1];
        Py_UCS4 ch;
        switch (e) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u': {
            if (i + 6 > end || !j_u4(c, i + 2, &ch)) goto done;
            i += 6;
            Py_UCS4 lo;
            if (ch >= 0xd800 && ch <= 0xdbff && i + 6 <= end && c->p[i] == '\\' && c->p[i + 1] == 'u' &&
                j_u4(c, i + 2, &lo) && lo >= 0xdc00 && lo <= 0xdfff) {
                ch = 0x10000 + (((ch - 0xd800) << 10) | (lo - 0xdc00));
                i += 6;
            }
            buf[o++] = ch;
            continue;
        }
        default: goto done;
        }
        buf[o++] = ch;
        i += 2;
    }
    res = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, buf, o);
done:
    PyMem_Free(buf);
    return res;
}

/* An integer at c->pos: 1 ok (*null set if the value is null), 0 fallback. */
static int j_int(jcur *c, long long *out, int *is_null) {
    *is_null = 0;
    if (c->n - c->pos >= 4 && memcmp(c->p + c->pos, "null", 4) == 0) {
        c->pos += 4;
        *is_null = 1;
        return 1;
    }
    Py_ssize_t i = c->pos;
    int neg = 0;
    if (i < c->n && c->p[i] == '-') { neg = 1; i++; }
    Py_ssize_t digits = i;
    long long acc = 0;
    while (i < c->n && c->p[i] >= '0' && c->p[i] <= '9') {
        if (i - digits >= 18) return 0;
        acc = acc * 10 + (c->p[i] - '0');
        i++;
    }
    if (i == digits) return 0;
    if (c->p[digits] == '0' && i - digits > 1) return 0;
    if (i < c->n && (c->p[i] == '.' || c->p[i] == 'e' || c->p[i] == 'E')) return 0;
    *out = neg ? -acc : acc;
    c->pos = i;
    return 1;
}

/* The length of a JSON integer literal at c->pos (-?(0|[1-9][0-9]*), not followed by a fraction
 * or exponent), or 0. */
static Py_ssize_t j_int_literal(jcur *c) {
    Py_ssize_t i = c->pos;
    if (i < c->n && c->p[i] == '-') i++;
    Py_ssize_t digits = i;
    while (i < c->n && c->p[i] >= '0' && c->p[i] <= '9') i++;
    if (i == digits) return 0;
    if (c->p[digits] == '0' && i - digits > 1) return 0;
    if (i < c->n && (c->p[i] == '.' || c->p[i] == 'e' || c->p[i] == 'E')) return 0;
    return i - c->pos;
}

/* An extFields value at c->pos, read as Apache's broker reads it into a map of strings: a string
 * as it is, an integer as its literal text, true/false as "true"/"false", null as absent (*out
 * NULL). Returns 1 ok, 0 fallback (floats and anything else go to Python), -1 fallback or error
 * (as j_str's NULL: error if one is set). */
static int j_ext_value(jcur *c, PyObject **out) {
    unsigned char b = c->p[c->pos];
    *out = NULL;
    if (b == '"') {
        *out = j_str(c);
        return *out == NULL ? -1 : 1;
    }
    if (b == 'n' && c->n - c->pos >= 4 && memcmp(c->p + c->pos, "null", 4) == 0) {
        c->pos += 4;
        return 1;
    }
    if (b == 't' && c->n - c->pos >= 4 && memcmp(c->p + c->pos, "true", 4) == 0) {
        c->pos += 4;
        *out = PyUnicode_FromStringAndSize("true", 4);
        return *out == NULL ? -1 : 1;
    }
    if (b == 'f' && c->n - c->pos >= 5 && memcmp(c->p + c->pos, "false", 5) == 0) {
        c->pos += 5;
        *out = PyUnicode_FromStringAndSize("false", 5);
        return *out == NULL ? -1 : 1;
    }
    Py_ssize_t len = j_int_literal(c);
    if (len == 0) return 0;
    *out = PyUnicode_FromStringAndSize((const char *)c->p + c->pos, len);
    if (*out == NULL) return -1;
    c->pos += len;
    return 1;
}

/* Remove the entries of `d` whose value is None; 0 ok, -1 error. */
static int drop_none_values(PyObject *d) {
    PyObject *keys = PyList_New(0);
    if (keys == NULL) return -1;
    PyObject *k, *v;
    Py_ssize_t i = 0;
    while (PyDict_Next(d, &i, &k, &v)) {
        if (v == Py_None && PyList_Append(keys, k) < 0) { Py_DECREF(keys); return -1; }
    }
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(keys); j++) {
        if (PyDict_DelItem(d, PyList_GET_ITEM(keys, j)) < 0) { Py_DECREF(keys); return -1; }
    }
    Py_DECREF(keys);
    return 0;
}

/* After an object member: 0 past a "," (another member follows), 1 past the closing "}", -1 on
 * anything else (not the JSON this decoder handles: the caller falls back). */
static int j_next_member(jcur *c) {
    j_ws(c);
    if (c->pos < c->n && c->p[c->pos] == ',') {
        c->pos++;
        j_ws(c);
        return 0;
    }
    if (c->pos < c->n && c->p[c->pos] == '}') {
        c->pos++;
        return 1;
    }
    return -1;
}

static PyObject *json_decode(modstate *st, const unsigned char *p, Py_ssize_t n) {
    jcur c = {p, n, 0};
    long long code = 0, flag = 0, opaque = 0, version = 0, lang = 0;
    PyObject *remark = Py_NewRef(Py_None), *ext = Py_NewRef(Py_None);
    int ext_nulls = 0;
    if (st->lang_names == NULL) goto fallback;
    j_ws(&c);
    if (c.pos >= n || p[c.pos] != '{') goto fallback;
    c.pos++;
    j_ws(&c);
    if (c.pos < n && p[c.pos] == '}') {
        c.pos++;
        goto closed;
    }
    while (1) {
        if (c.pos >= n || p[c.pos] != '"') goto fallback;
        PyObject *key = j_str(&c);
        if (key == NULL) goto fallback_or_error;
        Py_ssize_t klen;
        const char *kraw = PyUnicode_AsUTF8AndSize(key, &klen); /* lives as long as key */
        if (kraw == NULL) {
            Py_DECREF(key);
            if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) { PyErr_Clear(); goto fallback; }
            goto error;
        }
        int kind;
#define KEY_IS(lit) (klen == (Py_ssize_t)sizeof(lit) - 1 && memcmp(kraw, lit, sizeof(lit) - 1) == 0)
        kind = KEY_IS("code") ? 1 : KEY_IS("flag") ? 2 : KEY_IS("opaque") ? 3 : KEY_IS("version") ? 4
             : KEY_IS("language") ? 5 : KEY_IS("remark") ? 6 : KEY_IS("extFields") ? 7 : 0;
#undef KEY_IS
        Py_DECREF(key);
        j_ws(&c);
        if (c.pos >= n || p[c.pos] != ':') goto fallback;
        c.pos++;
        j_ws(&c);
        if (c.pos >= n) goto fallback;
        if (kind >= 1 && kind <= 4) {
            long long *target = kind == 1 ? &code : kind == 2 ? &flag : kind == 3 ? &opaque : &version;
            int is_null;
            long long v;
            if (!j_int(&c, &v, &is_null)) goto fallback;
            *target = is_null ? 0 : v; /* every default is 0 */
        } else if (kind == 5) {
            if (p[c.pos] == '"') {
                PyObject *name = j_str(&c);
                if (name == NULL) goto fallback_or_error;
                lang = st->lang_other_value;
                for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(st->lang_names); i++) {
                    PyObject *known = PyTuple_GET_ITEM(st->lang_names, i);
                    if (known != Py_None && PyUnicode_Compare(name, known) == 0) { lang = i; break; }
                }
                Py_DECREF(name);
                if (PyErr_Occurred()) goto error;
            } else {
                int is_null;
                long long v;
                if (!j_int(&c, &v, &is_null)) goto fallback;
                lang = is_null ? 0 : (v >= 0 && v < 64 && ((st->lang_valid >> v) & 1)) ? v : st->lang_other_value;
            }
        } else if (kind == 6) {
            if (p[c.pos] == '"') {
                PyObject *r = j_str(&c);
                if (r == NULL) goto fallback_or_error;
                Py_SETREF(remark, r);
            } else if (n - c.pos >= 4 && memcmp(p + c.pos, "null", 4) == 0) {
                c.pos += 4;
                Py_SETREF(remark, Py_NewRef(Py_None));
            } else goto fallback;
        } else if (kind == 7) {
            if (n - c.pos >= 4 && memcmp(p + c.pos, "null", 4) == 0) {
                c.pos += 4;
                Py_SETREF(ext, Py_NewRef(Py_None));
            } else {
                if (p[c.pos] != '{') goto fallback;
                c.pos++;
                PyObject *d = PyDict_New();
                if (d == NULL) goto error;
                Py_SETREF(ext, d);
                j_ws(&c);
                if (c.pos < n && p[c.pos] == '}') {
                    c.pos++;
                } else {
                    while (1) {
                        if (c.pos >= n || p[c.pos] != '"') goto fallback;
                        PyObject *k = j_str(&c);
                        if (k == NULL) goto fallback_or_error;
                        j_ws(&c);
                        if (c.pos >= n || p[c.pos] != ':') { Py_DECREF(k); goto fallback; }
                        c.pos++;
                        j_ws(&c);
                        if (c.pos >= n) { Py_DECREF(k); goto fallback; }
                        PyObject *v;
                        int vk = j_ext_value(&c, &v);
                        if (vk == 0) { Py_DECREF(k); goto fallback; }
                        if (vk < 0) { Py_DECREF(k); goto fallback_or_error; }
                        /* null is kept as None until the object ends, so that a duplicate key
                         * keeps its first position, as in json.loads; then it is removed. */
                        if (v == NULL) {
                            v = Py_NewRef(Py_None);
                            ext_nulls = 1;
                        }
                        int rc = PyDict_SetItem(ext, k, v);
                        Py_DECREF(v);
                        Py_DECREF(k);
                        if (rc < 0) goto error;
                        int next = j_next_member(&c);
                        if (next < 0) goto fallback;
                        if (next) break;
                    }
                    if (ext_nulls && drop_none_values(ext) < 0) goto error;
                }
            }
        } else {
            /* An unknown key: skip a string, an integer or null. */
            if (p[c.pos] == '"') {
                PyObject *skip = j_str(&c);
                if (skip == NULL) goto fallback_or_error;
                Py_DECREF(skip);
            } else {
                int is_null;
                long long v;
                if (!j_int(&c, &v, &is_null)) goto fallback;
            }
        }
        int next = j_next_member(&c);
        if (next < 0) goto fallback;
        if (next) break;
    }
closed:
    j_ws(&c);
    if (c.pos != n) goto fallback;
    {
        return command_from_ints(st, code, opaque, flag, remark, ext, PyLong_FromLongLong(lang),
                                 version, PyLong_FromLong(0));
    }
fallback_or_error:
    if (PyErr_Occurred()) goto error;
fallback:
error:
    Py_XDECREF(remark);
    Py_XDECREF(ext);
    return NULL;
}

/* Decode one header (any serialize type) into a new command. */
static PyObject *decode_one(modstate *st, unsigned int stype, const unsigned char *p, Py_ssize_t n) {
    if (stype == MSGPACK_TYPE || stype == ROCKETMQ_TYPE || stype == JSON_TYPE) {
        PyObject *cmd = stype == MSGPACK_TYPE    ? mp_decode(st, p, n)
                        : stype == ROCKETMQ_TYPE ? rq_decode(st, p, n)
                                                 : json_decode(st, p, n);
        if (cmd != NULL || PyErr_Occurred()) return cmd;
    }
    PyObject *data = PyBytes_FromStringAndSize((const char *)p, n);
    if (data == NULL) return NULL;
    PyObject *t = PyLong_FromUnsignedLong(stype);
    if (t == NULL) { Py_DECREF(data); return NULL; }
    PyObject *argv[2] = {t, data};
    PyObject *cmd = PyObject_Vectorcall(st->py_decode_header, argv, 2, NULL);
    Py_DECREF(t);
    Py_DECREF(data);
    return cmd;
}

static PyObject *decode_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    modstate *st = get_state(module);
    if (check_ready(st) < 0) return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode_header(serialize_type, data) takes 2 arguments");
        return NULL;
    }
    if (PyLong_Check(args[0]) && PyBytes_Check(args[1])) {
        int overflow;
        long t = PyLong_AsLongAndOverflow(args[0], &overflow);
        if (t == -1 && PyErr_Occurred()) return NULL;
        if (!overflow && (t == MSGPACK_TYPE || t == ROCKETMQ_TYPE || t == JSON_TYPE)) {
            const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[1]);
            Py_ssize_t n = PyBytes_GET_SIZE(args[1]);
            PyObject *cmd = t == MSGPACK_TYPE    ? mp_decode(st, p, n)
                            : t == ROCKETMQ_TYPE ? rq_decode(st, p, n)
                                                 : json_decode(st, p, n);
            if (cmd != NULL || PyErr_Occurred()) return cmd;
        }
    }
    return PyObject_Vectorcall(st->py_decode_header, args, 2, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* frame parsing                                                                               */
/* ------------------------------------------------------------------------------------------ */

static PyObject *parse_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    modstate *st = get_state(module);
    if (check_ready(st) < 0) return NULL;
    if (nargs != 3 || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "parse_frames(src, max_len, out: list) takes 3 arguments");
        return NULL;
    }
    int overflow;
    long long max_len = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (max_len == -1 && PyErr_Occurred()) return NULL;
    if (overflow > 0) max_len = LLONG_MAX;
    else if (overflow < 0) max_len = LLONG_MIN;
    PyObject *out = args[2];
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *src = (const unsigned char *)view.buf;
    Py_ssize_t end = view.len, pos = 0;
    while (end - pos >= 4) {
        long long length = (int32_t)rd32(src + pos);
        if (length > max_len) {
            PyErr_Format(st->too_large_error, "frame length %lld above the maximum %lld", length, max_len);
            goto fail;
        }
        if (length < 4) {
            PyErr_Format(st->frame_error, "frame length %lld is below 4", length);
            goto fail;
        }
        if (length > end - pos - 4) break; /* incomplete */
        Py_ssize_t frame_end = pos + 4 + (Py_ssize_t)length;
        uint32_t word = rd32(src + pos + 4);
        Py_ssize_t header_len = word & 0xFFFFFF;
        if (header_len > length - 4) {
            PyErr_Format(st->frame_error, "header length %zd exceeds frame length %lld", header_len, length);
            goto fail;
        }
        Py_ssize_t header_start = pos + 8, body_start = header_start + header_len;
        PyObject *cmd = decode_one(st, word >> 24, src + header_start, header_len);
        if (cmd == NULL) goto fail;
        if (body_start < frame_end) {
            PyObject *body = PyBytes_FromStringAndSize((const char *)src + body_start, frame_end - body_start);
            if (body == NULL) { Py_DECREF(cmd); goto fail; }
            int rc;
            if (Py_IS_TYPE(cmd, st->cmd_type)) {
                Py_XSETREF(SLOT(cmd, st, S_BODY), body);
                rc = 0;
            } else {
                rc = PyObject_SetAttrString(cmd, "body", body);
                Py_DECREF(body);
            }
            if (rc < 0) { Py_DECREF(cmd); goto fail; }
        }
        int rc = PyList_Append(out, cmd);
        Py_DECREF(cmd);
        if (rc < 0) goto fail;
        pos = frame_end;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(pos);
fail:
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* msgpack header encode (subset)                                                              */
/* ------------------------------------------------------------------------------------------ */

/* A plain integer slot value (not bool) as long long; 0 = fall back (or error if set). */
static int int_value(PyObject *o, long long *out) {
    if (!PyLong_Check(o) || PyBool_Check(o)) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return 0;
    if (overflow) return 0;
    *out = v;
    return 1;
}

static inline Py_ssize_t int_size(long long d) {
    if (d < -(1LL << 5)) {
        if (d < -(1LL << 15)) return d < -(1LL << 31) ? 9 : 5;
        return d < -(1LL << 7) ? 3 : 2;
    }
    if (d < (1LL << 7)) return 1;
    if (d < (1LL << 8)) return 2;
    if (d < (1LL << 16)) return 3;
    if (d < (1LL << 32)) return 5;
    return 9;
}

static inline unsigned char *wr16(unsigned char *w, uint32_t v) {
    w[0] = (unsigned char)(v >> 8); w[1] = (unsigned char)v;
    return w + 2;
}
static inline unsigned char *wr32(unsigned char *w, uint32_t v) {
    w[0] = (unsigned char)(v >> 24); w[1] = (unsigned char)(v >> 16);
    w[2] = (unsigned char)(v >> 8); w[3] = (unsigned char)v;
    return w + 4;
}
static inline unsigned char *wr64(unsigned char *w, uint64_t v) {
    w = wr32(w, (uint32_t)(v >> 32));
    return wr32(w, (uint32_t)v);
}

static unsigned char *put_int(unsigned char *w, long long d) {
    if (d < -(1LL << 5)) {
        if (d < -(1LL << 15)) {
            if (d < -(1LL << 31)) { *w++ = 0xd3; return wr64(w, (uint64_t)d); }
            *w++ = 0xd2; return wr32(w, (uint32_t)d);
        }
        if (d < -(1LL << 7)) { *w++ = 0xd1; return wr16(w, (uint32_t)d & 0xffff); }
        *w++ = 0xd0; *w++ = (unsigned char)d; return w;
    }
    if (d < (1LL << 7)) { *w++ = (unsigned char)d; return w; }
    if (d < (1LL << 8)) { *w++ = 0xcc; *w++ = (unsigned char)d; return w; }
    if (d < (1LL << 16)) { *w++ = 0xcd; return wr16(w, (uint32_t)d); }
    if (d < (1LL << 32)) { *w++ = 0xce; return wr32(w, (uint32_t)d); }
    *w++ = 0xcf; return wr64(w, (uint64_t)d);
}

static inline Py_ssize_t str_head_size(Py_ssize_t l) { return l < 32 ? 1 : l < 256 ? 2 : l < 65536 ? 3 : 5; }

static unsigned char *put_str(unsigned char *w, const char *s, Py_ssize_t l) {
    if (l < 32) *w++ = (unsigned char)(0xa0 | l);
    else if (l < 256) { *w++ = 0xd9; *w++ = (unsigned char)l; }
    else if (l < 65536) { *w++ = 0xda; w = wr16(w, (uint32_t)l); }
    else { *w++ = 0xdb; w = wr32(w, (uint32_t)l); }
    memcpy(w, s, (size_t)l);
    return w + l;
}

/* UTF-8 of a str, or 0 = fall back (surrogates; error cleared). */
static int utf8_of(PyObject *o, const char **s, Py_ssize_t *l) {
    if (!PyUnicode_Check(o)) return 0;
    *s = PyUnicode_AsUTF8AndSize(o, l);
    if (*s == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) PyErr_Clear();
        return 0;
    }
    if (*l > 0xFFFFFFFFLL) return 0;
    return 1;
}

/* code, language, version, opaque and flag of cmd into v[0..4]; 0 if one is missing or not a
 * plain int (the encoders then fall back to Python). */
static int int_fields(modstate *st, PyObject *cmd, long long v[5]) {
    static const int int_slots[5] = {S_CODE, S_LANGUAGE, S_VERSION, S_OPAQUE, S_FLAG};
    for (int i = 0; i < 5; i++) {
        PyObject *o = SLOT(cmd, st, int_slots[i]);
        if (o == NULL || !int_value(o, &v[i])) return 0;
    }
    return 1;
}

/* The msgpack header of cmd (a cmd_type instance) as bytes with `prefix` bytes reserved in front.
 * NULL without error: fall back to Python. */
static PyObject *mp_encode(modstate *st, PyObject *cmd, Py_ssize_t prefix) {
    long long v[5];
    if (!int_fields(st, cmd, v)) return NULL;
    PyObject *remark = SLOT(cmd, st, S_REMARK), *ext = SLOT(cmd, st, S_EXT);
    if (remark == NULL || ext == NULL) return NULL;
    Py_ssize_t size = 1;
    for (int i = 0; i < 5; i++) size += int_size(v[i]);
    const char *rs = NULL;
    Py_ssize_t rl = 0;
    if (remark == Py_None) size += 1;
    else {
        if (!utf8_of(remark, &rs, &rl)) return NULL;
        size += str_head_size(rl) + rl;
    }
    Py_ssize_t entries = 0;
    if (ext == Py_None) size += 1;
    else {
        if (!PyDict_CheckExact(ext)) return NULL;
        entries = PyDict_GET_SIZE(ext);
        if (entries > 0xFFFFFFFFLL) return NULL;
        size += entries < 16 ? 1 : entries < 65536 ? 3 : 5;
        Py_ssize_t it = 0;
        PyObject *k, *val;
        while (PyDict_Next(ext, &it, &k, &val)) {
            const char *s;
            Py_ssize_t l;
            if (!utf8_of(k, &s, &l)) return NULL;
            size += str_head_size(l) + l;
            if (!utf8_of(val, &s, &l)) return NULL;
            size += str_head_size(l) + l;
        }
    }
    PyObject *res = PyBytes_FromStringAndSize(NULL, prefix + size);
    if (res == NULL) return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(res) + prefix;
    *w++ = 0x97;
    for (int i = 0; i < 5; i++) w = put_int(w, v[i]);
    if (remark == Py_None) *w++ = 0xc0;
    else w = put_str(w, rs, rl);
    if (ext == Py_None) *w++ = 0xc0;
    else {
        if (entries < 16) *w++ = (unsigned char)(0x80 | entries);
        else if (entries < 65536) { *w++ = 0xde; w = wr16(w, (uint32_t)entries); }
        else { *w++ = 0xdf; w = wr32(w, (uint32_t)entries); }
        Py_ssize_t it = 0;
        PyObject *k, *val;
        while (PyDict_Next(ext, &it, &k, &val)) {
            const char *s;
            Py_ssize_t l;
            s = PyUnicode_AsUTF8AndSize(k, &l); /* cached by the first pass */
            if (s == NULL) { Py_DECREF(res); return NULL; }
            w = put_str(w, s, l);
            s = PyUnicode_AsUTF8AndSize(val, &l);
            if (s == NULL) { Py_DECREF(res); return NULL; }
            w = put_str(w, s, l);
        }
    }
    if ((char *)w != PyBytes_AS_STRING(res) + prefix + size) {
        Py_DECREF(res);
        PyErr_SetString(PyExc_SystemError, "remoting._speedups: msgpack header size mismatch");
        return NULL;
    }
    return res;
}

/* ROCKETMQ binary header of cmd with `prefix` bytes reserved; NULL without error: use Python. */
static PyObject *rq_encode(modstate *st, PyObject *cmd, Py_ssize_t prefix) {
    long long v[5];
    if (!int_fields(st, cmd, v)) return NULL;
    long long code = v[0], lang = v[1], version = v[2], opaque = v[3], flag = v[4];
    if (code < INT16_MIN || code > INT16_MAX || version < INT16_MIN || version > INT16_MAX ||
        opaque < INT32_MIN || opaque > INT32_MAX || flag < INT32_MIN || flag > INT32_MAX)
        return NULL; /* Python raises the ValueError */
    if (lang < 0 || lang > 255) lang = st->lang_other_value;
    PyObject *remark = SLOT(cmd, st, S_REMARK), *ext = SLOT(cmd, st, S_EXT);
    if (remark == NULL || ext == NULL) return NULL;
    const char *rs = NULL;
    Py_ssize_t rl = 0;
    if (remark != Py_None) {
        if (!PyUnicode_Check(remark)) return NULL;
        if (PyUnicode_GET_LENGTH(remark) > 0 && !utf8_of(remark, &rs, &rl)) return NULL;
        if (rl > INT32_MAX) return NULL;
    }
    long long block = 0;
    if (ext != Py_None) {
        if (!PyDict_CheckExact(ext)) return NULL;
        Py_ssize_t it = 0;
        PyObject *k, *val;
        while (PyDict_Next(ext, &it, &k, &val)) {
            const char *s;
            Py_ssize_t kl, vl;
            if (!utf8_of(k, &s, &kl) || kl > 0x7FFF) return NULL;
            if (!utf8_of(val, &s, &vl) || vl > INT32_MAX) return NULL;
            block += 2 + kl + 4 + vl;
            if (block > INT32_MAX) return NULL;
        }
    }
    Py_ssize_t size = 13 + 4 + rl + 4 + (Py_ssize_t)block;
    PyObject *res = PyBytes_FromStringAndSize(NULL, prefix + size);
    if (res == NULL) return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(res) + prefix;
    w = wr16(w, (uint32_t)code & 0xffff);
    *w++ = (unsigned char)lang;
    w = wr16(w, (uint32_t)version & 0xffff);
    w = wr32(w, (uint32_t)opaque);
    w = wr32(w, (uint32_t)flag);
    w = wr32(w, (uint32_t)rl);
    if (rl) { memcpy(w, rs, (size_t)rl); w += rl; }
    w = wr32(w, (uint32_t)block);
    if (block) {
        Py_ssize_t it = 0;
        PyObject *k, *val;
        while (PyDict_Next(ext, &it, &k, &val)) {
            Py_ssize_t kl, vl;
            const char *ks = PyUnicode_AsUTF8AndSize(k, &kl); /* cached by the first pass */
            const char *vs = ks == NULL ? NULL : PyUnicode_AsUTF8AndSize(val, &vl);
            if (vs == NULL) { Py_DECREF(res); return NULL; }
            w = wr16(w, (uint32_t)kl);
            memcpy(w, ks, (size_t)kl);
            w += kl;
            w = wr32(w, (uint32_t)vl);
            memcpy(w, vs, (size_t)vl);
            w += vl;
        }
    }
    if ((char *)w != PyBytes_AS_STRING(res) + prefix + size) {
        Py_DECREF(res);
        PyErr_SetString(PyExc_SystemError, "remoting._speedups: ROCKETMQ header size mismatch");
        return NULL;
    }
    return res;
}

/* ------------------------------------------------------------------------------------------ */
/* JSON header encode (type 0)                                                                 */
/* ------------------------------------------------------------------------------------------ */
/* The layout of remoting._header_codec._encode_json: fixed fields in fastjson's alphabetical
 * order, remark and extFields as json.dumps(ensure_ascii=True, separators=(",", ":")) writes them:
 * printable ASCII as is except '"' and '\\', the short escapes \b \f \n \r \t, everything else
 * as lowercase \uXXXX (astral characters as a surrogate pair, lone surrogates as themselves).
 * Decoding: json_decode below. */

static Py_ssize_t json_str_size(PyObject *s) {
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), size = 2;
    if (PyUnicode_IS_ASCII(s)) {
        const unsigned char *p = (const unsigned char *)data;
        for (Py_ssize_t i = 0; i < n; i++) {
            unsigned char c = p[i];
            if (c >= 0x20 && c <= 0x7e) size += (c == '"' || c == '\\') ? 2 : 1;
            else size += (c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t') ? 2 : 6;
        }
        return size;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= 0x20 && c <= 0x7e) size += (c == '"' || c == '\\') ? 2 : 1;
        else if (c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t') size += 2;
        else size += c >= 0x10000 ? 12 : 6;
    }
    return size;
}

static char *json_u(char *w, Py_UCS4 c) {
    static const char hex[] = "0123456789abcdef";
    *w++ = '\\'; *w++ = 'u';
    *w++ = hex[(c >> 12) & 0xf]; *w++ = hex[(c >> 8) & 0xf];
    *w++ = hex[(c >> 4) & 0xf]; *w++ = hex[c & 0xf];
    return w;
}

static char *json_str_write(char *w, PyObject *s) {
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    *w++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= 0x20 && c <= 0x7e) {
            if (c == '"' || c == '\\') *w++ = '\\';
            *w++ = (char)c;
            continue;
        }
        switch (c) {
        case '\b': *w++ = '\\'; *w++ = 'b'; continue;
        case '\f': *w++ = '\\'; *w++ = 'f'; continue;
        case '\n': *w++ = '\\'; *w++ = 'n'; continue;
        case '\r': *w++ = '\\'; *w++ = 'r'; continue;
        case '\t': *w++ = '\\'; *w++ = 't'; continue;
        default: break;
        }
        if (c >= 0x10000) {
            Py_UCS4 v = c - 0x10000;
            w = json_u(w, 0xd800 | ((v >> 10) & 0x3ff));
            w = json_u(w, 0xdc00 | (v & 0x3ff));
        } else {
            w = json_u(w, c);
        }
    }
    *w++ = '"';
    return w;
}

static PyObject *json_encode(modstate *st, PyObject *cmd, Py_ssize_t prefix) {
    long long v[5];
    if (!int_fields(st, cmd, v)) return NULL;
    long long lang = v[1];
    PyObject *name = NULL;
    if (st->lang_names != NULL && lang >= 0 && lang < PyTuple_GET_SIZE(st->lang_names))
        name = PyTuple_GET_ITEM(st->lang_names, lang);
    const char *lang_name = "OTHER";
    if (name != NULL && name != Py_None) lang_name = (const char *)PyUnicode_DATA(name);
    PyObject *remark = SLOT(cmd, st, S_REMARK), *ext = SLOT(cmd, st, S_EXT);
    if (remark == NULL || ext == NULL) return NULL;
    if (remark != Py_None && !PyUnicode_Check(remark)) return NULL;
    if (ext != Py_None && !PyDict_CheckExact(ext)) return NULL;
    char head[128], tail[160];
    int hl = snprintf(head, sizeof(head), "{\"code\":%lld", v[0]);
    int tl = snprintf(tail, sizeof(tail), ",\"flag\":%lld,\"language\":\"%s\",\"opaque\":%lld", v[4], lang_name, v[3]);
    char end[96];
    int el = snprintf(end, sizeof(end), ",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":%lld}", v[2]);
    if (hl < 0 || tl < 0 || el < 0 || hl >= (int)sizeof(head) || tl >= (int)sizeof(tail) || el >= (int)sizeof(end))
        return NULL;
    Py_ssize_t size = hl + tl + el;
    if (ext != Py_None) {
        size += 13 + 2; /* ,"extFields": {} */
        Py_ssize_t it = 0, count = 0;
        PyObject *k, *val;
        while (PyDict_Next(ext, &it, &k, &val)) {
            if (!PyUnicode_Check(k) || !PyUnicode_Check(val)) return NULL;
            size += json_str_size(k) + 1 + json_str_size(val);
            count++;
        }
        if (count > 1) size += count - 1;
    }
    if (remark != Py_None) size += 10 + json_str_size(remark); /* ,"remark": */
    PyObject *res = PyBytes_FromStringAndSize(NULL, prefix + size);
    if (res == NULL) return NULL;
    char *w = PyBytes_AS_STRING(res) + prefix;
    memcpy(w, head, (size_t)hl); w += hl;
    if (ext != Py_None) {
        memcpy(w, ",\"extFields\":{", 14); w += 14;
        Py_ssize_t it = 0;
        PyObject *k, *val;
        int first = 1;
        while (PyDict_Next(ext, &it, &k, &val)) {
            if (!first) *w++ = ',';
            first = 0;
            w = json_str_write(w, k);
            *w++ = ':';
            w = json_str_write(w, val);
        }
        *w++ = '}';
    }
    memcpy(w, tail, (size_t)tl); w += tl;
    if (remark != Py_None) {
        memcpy(w, ",\"remark\":", 10); w += 10;
        w = json_str_write(w, remark);
    }
    memcpy(w, end, (size_t)el); w += el;
    if (w != PyBytes_AS_STRING(res) + prefix + size) {
        Py_DECREF(res);
        PyErr_SetString(PyExc_SystemError, "remoting._speedups: JSON header size mismatch");
        return NULL;
    }
    return res;
}

/* The serialize type to encode `cmd` natively with (msgpack, ROCKETMQ, JSON), or -1 for Python:
 * only exact RemotingCommands (subclasses take the Python path) with a plain int type. */
static long native_stype(modstate *st, PyObject *cmd) {
    if (!Py_IS_TYPE(cmd, st->cmd_type)) return -1;
    PyObject *t = SLOT(cmd, st, S_STYPE);
    if (t == NULL) return -1;
    if (t == st->msgpack_type) return MSGPACK_TYPE;
    if (!PyLong_Check(t) || PyBool_Check(t)) return -1;
    int overflow;
    long v = PyLong_AsLongAndOverflow(t, &overflow);
    if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
    return !overflow && (v == MSGPACK_TYPE || v == ROCKETMQ_TYPE || v == JSON_TYPE) ? v : -1;
}

static PyObject *native_encode(modstate *st, PyObject *cmd, long t, Py_ssize_t prefix) {
    if (t == MSGPACK_TYPE) return mp_encode(st, cmd, prefix);
    return t == ROCKETMQ_TYPE ? rq_encode(st, cmd, prefix) : json_encode(st, cmd, prefix);
}

static PyObject *encode_header(PyObject *module, PyObject *cmd) {
    modstate *st = get_state(module);
    if (check_ready(st) < 0) return NULL;
    long t = native_stype(st, cmd);
    if (t >= 0) {
        PyObject *r = native_encode(st, cmd, t, 0);
        if (r != NULL || PyErr_Occurred()) return r;
    }
    return PyObject_CallOneArg(st->py_encode_header, cmd);
}

static PyObject *encode_frame_parts(PyObject *module, PyObject *cmd) {
    modstate *st = get_state(module);
    if (check_ready(st) < 0) return NULL;
    PyObject *head = NULL, *body = NULL, *stype = NULL;
    Py_ssize_t header_len;
    int native = 0;
    long t = native_stype(st, cmd);
    if (t >= 0) {
        head = native_encode(st, cmd, t, 8);
        if (head == NULL && PyErr_Occurred()) return NULL;
        native = head != NULL;
    }
    if (native) {
        header_len = PyBytes_GET_SIZE(head) - 8;
    } else {
        PyObject *header = PyObject_CallOneArg(st->py_encode_header, cmd);
        if (header == NULL) return NULL;
        if (!PyBytes_Check(header)) {
            Py_DECREF(header);
            PyErr_SetString(PyExc_TypeError, "encode_header did not return bytes");
            return NULL;
        }
        header_len = PyBytes_GET_SIZE(header);
        head = PyBytes_FromStringAndSize(NULL, 8 + header_len);
        if (head == NULL) { Py_DECREF(header); return NULL; }
        memcpy(PyBytes_AS_STRING(head) + 8, PyBytes_AS_STRING(header), (size_t)header_len);
        Py_DECREF(header);
    }
    if (header_len > MAX_HEADER_LEN) {
        PyErr_Format(PyExc_ValueError, "header of %zd bytes does not fit in 24 bits", header_len);
        goto fail;
    }
    if (Py_IS_TYPE(cmd, st->cmd_type) && SLOT(cmd, st, S_BODY) != NULL && SLOT(cmd, st, S_STYPE) != NULL) {
        body = Py_NewRef(SLOT(cmd, st, S_BODY));
        stype = Py_NewRef(SLOT(cmd, st, S_STYPE));
    } else {
        body = PyObject_GetAttrString(cmd, "body");
        if (body == NULL) goto fail;
        stype = PyObject_GetAttrString(cmd, "serialize_type");
        if (stype == NULL) goto fail;
    }
    Py_ssize_t body_len = 0;
    if (body != Py_None) {
        body_len = PyObject_Size(body);
        if (body_len < 0) goto fail;
    }
    long long length = 4 + (long long)header_len + (long long)body_len;
    if (length > 0x7FFFFFFF) {
        PyErr_Format(PyExc_ValueError, "frame of %lld bytes does not fit in int32", length);
        goto fail;
    }
    if (!native) {
        /* The Python encoder accepted it, so it is one of the known (small) types. */
        t = PyLong_AsLong(stype);
        if (t == -1 && PyErr_Occurred()) goto fail;
        if (t < 0 || t > 255) {
            PyErr_Format(PyExc_ValueError, "unknown serialize type %ld", t);
            goto fail;
        }
    }
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(head);
    w = wr32(w, (uint32_t)length);
    wr32(w, ((uint32_t)t << 24) | (uint32_t)header_len);
    Py_DECREF(stype);
    if (body_len == 0) Py_SETREF(body, Py_NewRef(Py_None));
    PyObject *res = PyTuple_New(2);
    if (res == NULL) { Py_DECREF(head); Py_DECREF(body); return NULL; }
    PyTuple_SET_ITEM(res, 0, head);
    PyTuple_SET_ITEM(res, 1, body);
    return res;
fail:
    Py_XDECREF(head);
    Py_XDECREF(body);
    Py_XDECREF(stype);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* FieldsDecoder: a typed header from an extFields dict (remoting/protocol/headers.py)          */
/* ------------------------------------------------------------------------------------------ */
/* FieldsDecoder(cls, table, fallback) is called like the generated Python `_decode(cls, f)` it
 * wraps: table is ((attr, wire, kind, required, default), ...) with kind 0 str, 1 int32 (Java
 * Integer), 2 bool, 3 int64 (Java Long).
 * The common case (f a dict of str values, every required field present, numbers that parse
 * and fit their type, plain ASCII booleans) is built here; anything else is handed to
 * `fallback`, which gives the authoritative result or HeaderError. */

enum { K_STR = 0, K_INT32 = 1, K_BOOL = 2, K_INT64 = 3 };

typedef struct {
    Py_ssize_t offset;
    PyObject *key;
    PyObject *dflt;
    long long lo, hi; /* the range of an int32/int64 field */
    int kind;
    int required;
} field_t;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    PyObject *fallback;
    Py_ssize_t n;
    field_t *fields;
} FieldsDecoder;

static int fd_traverse(FieldsDecoder *self, visitproc visit, void *arg) {
    Py_VISIT(self->cls);
    Py_VISIT(self->fallback);
    for (Py_ssize_t i = 0; i < self->n; i++) {
        Py_VISIT(self->fields[i].key);
        Py_VISIT(self->fields[i].dflt);
    }
    return 0;
}

static int fd_clear(FieldsDecoder *self) {
    Py_CLEAR(self->cls);
    Py_CLEAR(self->fallback);
    for (Py_ssize_t i = 0; i < self->n; i++) {
        Py_CLEAR(self->fields[i].key);
        Py_CLEAR(self->fields[i].dflt);
    }
    return 0;
}

static void fd_dealloc(FieldsDecoder *self) {
    PyObject_GC_UnTrack(self);
    fd_clear(self);
    PyMem_Free(self->fields);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* int(v) for an exact str v, into *out when it is within [lo, hi]: 1. 0 when it does not
 * parse or is out of range (the caller hands the input to the Python decoder, which raises the
 * HeaderError); -1 with an exception set on any other failure. */
static int str_to_ll(PyObject *v, long long lo, long long hi, long long *out) {
    if (PyUnicode_IS_ASCII(v)) {
        const unsigned char *s = (const unsigned char *)PyUnicode_DATA(v);
        Py_ssize_t len = PyUnicode_GET_LENGTH(v), i = 0;
        int neg = 0;
        if (len > 0 && (s[0] == '-' || s[0] == '+')) { neg = s[0] == '-'; i = 1; }
        if (len > i && len - i <= 18) {
            long long acc = 0;
            for (; i < len; i++) {
                if (s[i] < '0' || s[i] > '9') break;
                acc = acc * 10 + (s[i] - '0');
            }
            if (i == len) {
                if (neg) acc = -acc;
                if (acc < lo || acc > hi) return 0;
                *out = acc;
                return 1;
            }
        }
    }
    PyObject *n = PyLong_FromUnicodeObject(v, 10);
    if (n == NULL) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) { PyErr_Clear(); return 0; }
        return -1;
    }
    int overflow = 0;
    long long d = PyLong_AsLongLongAndOverflow(n, &overflow);
    Py_DECREF(n);
    if (d == -1 && PyErr_Occurred()) return -1;
    if (overflow || d < lo || d > hi) return 0;
    *out = d;
    return 1;
}

static PyObject *fd_call(FieldsDecoder *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || kwnames != NULL || args[0] != (PyObject *)self->cls || !PyDict_CheckExact(args[1]))
        return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
    PyObject *f = args[1];
    PyObject *obj = self->cls->tp_alloc(self->cls, 0);
    if (obj == NULL) return NULL;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        field_t *fl = &self->fields[i];
        PyObject *v = PyDict_GetItemWithError(f, fl->key); /* borrowed */
        PyObject *value;
        if (v == NULL) {
            if (PyErr_Occurred()) goto error;
            if (fl->required) goto fallback;
            value = Py_NewRef(fl->dflt);
        } else if (!PyUnicode_CheckExact(v)) {
            goto fallback;
        } else if (fl->kind == K_STR) {
            value = Py_NewRef(v);
        } else if (fl->kind != K_BOOL) { /* K_INT32, K_INT64 */
            long long d;
            int got = str_to_ll(v, fl->lo, fl->hi, &d);
            if (got <= 0) {
                if (got == 0) goto fallback;
                goto error;
            }
            value = PyLong_FromLongLong(d);
            if (value == NULL) goto error;
        } else {
            /* v == "true" or v.lower() == "true"; non-ASCII text goes to Python. */
            if (!PyUnicode_IS_ASCII(v)) goto fallback;
            const unsigned char *s = (const unsigned char *)PyUnicode_DATA(v);
            int t = PyUnicode_GET_LENGTH(v) == 4 && (s[0] | 0x20) == 't' && (s[1] | 0x20) == 'r' &&
                    (s[2] | 0x20) == 'u' && (s[3] | 0x20) == 'e';
            value = Py_NewRef(t ? Py_True : Py_False);
        }
        Py_XSETREF(*(PyObject **)((char *)obj + fl->offset), value);
    }
    return obj;
fallback:
    Py_DECREF(obj);
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
error:
    Py_DECREF(obj);
    return NULL;
}

static PyObject *fd_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *cls, *table, *fallback;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "FieldsDecoder takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!O!O:FieldsDecoder", &PyType_Type, &cls, &PyTuple_Type, &table, &fallback))
        return NULL;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "FieldsDecoder: fallback must be callable");
        return NULL;
    }
    PyTypeObject *tp = (PyTypeObject *)cls;
    Py_ssize_t n = PyTuple_GET_SIZE(table);
    FieldsDecoder *self = (FieldsDecoder *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = (vectorcallfunc)fd_call;
    self->fields = PyMem_Calloc(n ? (size_t)n : 1, sizeof(field_t));
    if (self->fields == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->cls = (PyTypeObject *)Py_NewRef(cls);
    self->fallback = Py_NewRef(fallback);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyTuple_GET_ITEM(table, i);
        PyObject *attr, *wire, *dflt;
        int kind, required;
        if (!PyTuple_Check(row) ||
            !PyArg_ParseTuple(row, "UUipO:FieldsDecoder row", &attr, &wire, &kind, &required, &dflt)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "FieldsDecoder: each row must be a tuple");
            Py_DECREF(self);
            return NULL;
        }
        if (kind != K_STR && kind != K_INT32 && kind != K_BOOL && kind != K_INT64) {
            PyErr_Format(PyExc_ValueError, "FieldsDecoder: unknown kind %d", kind);
            Py_DECREF(self);
            return NULL;
        }
        PyObject *descr = PyDict_GetItemWithError(tp->tp_dict, attr); /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "%s has no __slots__ member %R", tp->tp_name, attr);
            Py_DECREF(self);
            return NULL;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset < (Py_ssize_t)sizeof(PyObject) ||
            m->offset + (Py_ssize_t)sizeof(PyObject *) > tp->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s.%U is not a plain object slot", tp->tp_name, attr);
            Py_DECREF(self);
            return NULL;
        }
        field_t *fl = &self->fields[i];
        fl->offset = m->offset;
        fl->key = Py_NewRef(wire);
        PyUnicode_InternInPlace(&fl->key);
        fl->dflt = Py_NewRef(dflt);
        fl->kind = kind;
        fl->lo = kind == K_INT32 ? INT32_MIN : LLONG_MIN;
        fl->hi = kind == K_INT32 ? INT32_MAX : LLONG_MAX;
        fl->required = required;
        self->n = i + 1;
    }
    return (PyObject *)self;
}

static PyObject *fd_repr(FieldsDecoder *self) {
    return PyUnicode_FromFormat("<FieldsDecoder for %s, %zd fields>", self->cls ? self->cls->tp_name : "?", self->n);
}

static PyTypeObject FieldsDecoder_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "remoting._speedups.FieldsDecoder",
    .tp_basicsize = sizeof(FieldsDecoder),
    .tp_dealloc = (destructor)fd_dealloc,
    .tp_vectorcall_offset = offsetof(FieldsDecoder, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_repr = (reprfunc)fd_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "FieldsDecoder(cls, table, fallback): native extFields -> typed header decoder.",
    .tp_traverse = (traverseproc)fd_traverse,
    .tp_clear = (inquiry)fd_clear,
    .tp_new = fd_new,
};

/* ------------------------------------------------------------------------------------------ */
/* module                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)setup, METH_VARARGS,
     "setup(cmd_type, py_decode_header, py_encode_header, frame_error, too_large_error, lang_valid, lang_other, lang_names)"},
    {"parse_frames", (PyCFunction)(void (*)(void))parse_frames, METH_FASTCALL,
     "parse_frames(src, max_len, out) -> bytes consumed; complete frames are appended to out"},
    {"decode_header", (PyCFunction)(void (*)(void))decode_header, METH_FASTCALL,
     "decode_header(serialize_type, data) -> RemotingCommand"},
    {"encode_header", (PyCFunction)encode_header, METH_O, "encode_header(cmd) -> bytes"},
    {"encode_frame_parts", (PyCFunction)encode_frame_parts, METH_O,
     "encode_frame_parts(cmd) -> (length + header word + header, body or None)"},
    {NULL, NULL, 0, NULL},
};

static int mod_traverse(PyObject *m, visitproc visit, void *arg) {
    modstate *st = get_state(m);
    Py_VISIT(st->cmd_type);
    Py_VISIT(st->py_decode_header);
    Py_VISIT(st->py_encode_header);
    Py_VISIT(st->frame_error);
    Py_VISIT(st->too_large_error);
    Py_VISIT(st->msgpack_type);
    Py_VISIT(st->lang_other);
    Py_VISIT(st->lang_names);
    return 0;
}

static int mod_clear(PyObject *m) {
    modstate *st = get_state(m);
    Py_CLEAR(st->cmd_type);
    Py_CLEAR(st->py_decode_header);
    Py_CLEAR(st->py_encode_header);
    Py_CLEAR(st->frame_error);
    Py_CLEAR(st->too_large_error);
    Py_CLEAR(st->msgpack_type);
    Py_CLEAR(st->lang_other);
    Py_CLEAR(st->lang_names);
    return 0;
}

static void mod_free(void *m) { mod_clear((PyObject *)m); }

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "remoting._speedups", "Native frame and msgpack header codec.",
    sizeof(modstate), methods, NULL, mod_traverse, mod_clear, mod_free,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    if (PyType_Ready(&FieldsDecoder_Type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    memset(get_state(m), 0, sizeof(modstate));
    if (PyModule_AddObjectRef(m, "FieldsDecoder", (PyObject *)&FieldsDecoder_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
