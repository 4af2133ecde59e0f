/* common.acl_native: RocketMQ's ACL request signature (common/acl.py) in one native call.
 *
 * hmac_sha1_b64(key, fields, order, body) -> Base64 (ASCII bytes) of HMAC-SHA1(key, text + body)
 * where text is the UTF-8 of fields[k] for k in order, concatenated: what common.acl's
 * `_HmacSha1.signature(_signed_text(fields), body)` returns. None when a value is not a str or
 * has no strict UTF-8 form (an unpaired surrogate): the caller then takes the Python path,
 * which writes '?' for it as Java does. SHA-1 is OpenSSL's (libcrypto) through its SHA1_*
 * functions: deprecated in OpenSSL 3 in favour of EVP, whose per-digest set-up cost about as
 * much as hashing the whole signed text of a send (a 1 KiB body included) does here.
 *
 * Built as a separate optional extension (pyproject.toml): without OpenSSL's headers only the
 * ACL falls back to Python; common.speedups is unaffected.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>
#include <string.h>

#define BLOCK 64
#define DIGEST 20

static int digest_parts(const unsigned char *pad, Py_ssize_t npad, PyObject *fields,
                        PyObject *order, Py_buffer *body, unsigned char *out, int *failed) {
    /* SHA-1 of pad, then each field's UTF-8, then body. *failed: a value the Python path must
     * handle (returns 0 with no exception set). */
    SHA_CTX ctx;
    if (!SHA1_Init(&ctx) || !SHA1_Update(&ctx, pad, (size_t)npad)) {
        PyErr_SetString(PyExc_RuntimeError, "SHA-1 failed");
        return -1;
    }
    if (order != NULL) {
        Py_ssize_t n = PyTuple_GET_SIZE(order);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *value = PyDict_GetItemWithError(fields, PyTuple_GET_ITEM(order, i));
            if (value == NULL) {
                if (PyErr_Occurred()) return -1;
                *failed = 1;
                return 0;
            }
            if (!PyUnicode_Check(value)) {
                *failed = 1;
                return 0;
            }
            Py_ssize_t len;
            const char *utf8 = PyUnicode_AsUTF8AndSize(value, &len);
            if (utf8 == NULL) {
                PyErr_Clear(); /* an unpaired surrogate: the Python path replaces it */
                *failed = 1;
                return 0;
            }
            if (len && !SHA1_Update(&ctx, utf8, (size_t)len)) {
                PyErr_SetString(PyExc_RuntimeError, "SHA-1 failed");
                return -1;
            }
        }
    }
    if (body != NULL && body->len && !SHA1_Update(&ctx, body->buf, (size_t)body->len)) {
        PyErr_SetString(PyExc_RuntimeError, "SHA-1 failed");
        return -1;
    }
    if (!SHA1_Final(out, &ctx)) {
        PyErr_SetString(PyExc_RuntimeError, "SHA-1 failed");
        return -1;
    }
    return 0;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static PyObject *hmac_sha1_b64(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "hmac_sha1_b64(key, fields, order, body)");
        return NULL;
    }
    PyObject *key = args[0], *fields = args[1], *order = args[2], *body_obj = args[3];
    if (!PyBytes_Check(key) || !PyDict_Check(fields) || !PyTuple_Check(order)) {
        PyErr_SetString(PyExc_TypeError, "hmac_sha1_b64(bytes, dict, tuple, body)");
        return NULL;
    }
    unsigned char k[BLOCK], ipad[BLOCK], opad[BLOCK], inner[DIGEST], mac[DIGEST];
    memset(k, 0, BLOCK);
    Py_ssize_t klen = PyBytes_GET_SIZE(key);
    int failed = 0;
    if (klen > BLOCK) { /* RFC 2104: a long key is hashed first */
        Py_buffer kb;
        if (PyObject_GetBuffer(key, &kb, PyBUF_SIMPLE) < 0) return NULL;
        int rc = digest_parts((const unsigned char *)kb.buf, kb.len, NULL, NULL, NULL, k, &failed);
        PyBuffer_Release(&kb);
        if (rc < 0) return NULL;
    } else {
        memcpy(k, PyBytes_AS_STRING(key), (size_t)klen);
    }
    for (int i = 0; i < BLOCK; i++) {
        ipad[i] = k[i] ^ 0x36;
        opad[i] = k[i] ^ 0x5c;
    }
    Py_buffer body;
    Py_buffer *bodyp = NULL;
    if (body_obj != Py_None) {
        if (PyObject_GetBuffer(body_obj, &body, PyBUF_SIMPLE) < 0) return NULL;
        bodyp = &body;
    }
    int rc = digest_parts(ipad, BLOCK, fields, order, bodyp, inner, &failed);
    if (bodyp != NULL) PyBuffer_Release(bodyp);
    if (rc < 0) return NULL;
    if (failed) Py_RETURN_NONE;
    /* outer: SHA-1(opad + inner digest) */
    SHA_CTX ctx;
    if (!SHA1_Init(&ctx) || !SHA1_Update(&ctx, opad, BLOCK) || !SHA1_Update(&ctx, inner, DIGEST) ||
        !SHA1_Final(mac, &ctx)) {
        PyErr_SetString(PyExc_RuntimeError, "SHA-1 failed");
        return NULL;
    }
    /* Base64 of 20 bytes: 6 full groups and one of 2 bytes, 28 characters with one '='. */
    char out[28];
    int o = 0;
    for (int i = 0; i < 18; i += 3) {
        unsigned v = ((unsigned)mac[i] << 16) | ((unsigned)mac[i + 1] << 8) | mac[i + 2];
        out[o++] = b64[(v >> 18) & 63];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = b64[(v >> 6) & 63];
        out[o++] = b64[v & 63];
    }
    unsigned v = ((unsigned)mac[18] << 16) | ((unsigned)mac[19] << 8);
    out[o++] = b64[(v >> 18) & 63];
    out[o++] = b64[(v >> 12) & 63];
    out[o++] = b64[(v >> 6) & 63];
    out[o++] = '=';
    return PyBytes_FromStringAndSize(out, 28);
}

static PyMethodDef methods[] = {
    {"hmac_sha1_b64", (PyCFunction)(void (*)(void))hmac_sha1_b64, METH_FASTCALL,
     "Base64 of HMAC-SHA1(key, UTF-8 of fields[k] for k in order, then body); None: use the "
     "Python path."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "common.acl_native", "RocketMQ's ACL signature, natively.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_acl_native(void) { return PyModule_Create(&module); }
