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
 * check_signed(fields, body, code, secrets, granted, field_codes, orders) -> bool: True when the
 * request may be served without the Python checker: its AccessKey names an account in
 * `secrets`, the code's one deciding field (`field_codes`) with that key and code is a grant the
 * checker made under the rules in force (`granted`), and the Signature verifies (compared in
 * constant time). False says nothing: the Python checker decides, and words any refusal.
 *
 * sign_fields(key, access_key, token, fields, body, orders) -> dict | None: what
 * `RequestSigner.sign_fields` returns, or None when the Python path must do it (an order not
 * cached yet, a value without a strict UTF-8 form).
 *
 * `orders` is common.acl's `_ORDERS` (keys as they arrive -> (keys in signing order, getter)),
 * read only: a miss goes back to Python, which fills it.
 *
 * Built as a separate optional extension (pyproject.toml): without OpenSSL's headers only the
 * ACL falls back to Python; common.speedups is unaffected.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/crypto.h>
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

static int hmac_b64(PyObject *key, PyObject *fields, PyObject *order, Py_buffer *bodyp,
                    char *out, int *failed);

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* HMAC-SHA1(key, fields' values in order, then body) as 28 Base64 characters into out.
 * -1: exception set; 0: done, or *failed set (the Python path must sign). */
static int hmac_b64(PyObject *key, PyObject *fields, PyObject *order, Py_buffer *bodyp,
                    char *out, int *failed) {
    unsigned char k[BLOCK], ipad[BLOCK], opad[BLOCK], inner[DIGEST], mac[DIGEST];
    memset(k, 0, BLOCK);
    Py_ssize_t klen = PyBytes_GET_SIZE(key);
    if (klen > BLOCK) { /* RFC 2104: a long key is hashed first */
        Py_buffer kb;
        if (PyObject_GetBuffer(key, &kb, PyBUF_SIMPLE) < 0) return -1;
        int rc = digest_parts((const unsigned char *)kb.buf, kb.len, NULL, NULL, NULL, k, failed);
        PyBuffer_Release(&kb);
        if (rc < 0) return -1;
    } else {
        memcpy(k, PyBytes_AS_STRING(key), (size_t)klen);
    }
    for (int i = 0; i < BLOCK; i++) {
        ipad[i] = k[i] ^ 0x36;
        opad[i] = k[i] ^ 0x5c;
    }
    if (digest_parts(ipad, BLOCK, fields, order, bodyp, inner, failed) < 0) return -1;
    if (*failed) return 0;
    /* outer: SHA-1(opad + inner digest) */
    SHA_CTX ctx;
    if (!SHA1_Init(&ctx) || !SHA1_Update(&ctx, opad, BLOCK) || !SHA1_Update(&ctx, inner, DIGEST) ||
        !SHA1_Final(mac, &ctx)) {
        PyErr_SetString(PyExc_RuntimeError, "SHA-1 failed");
        return -1;
    }
    /* Base64 of 20 bytes: 6 full groups and one of 2 bytes, 28 characters with one '='. */
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
    return 0;
}

/* hmac_b64 with the body given as an object (None or any buffer). */
static int hmac_b64_of(PyObject *key, PyObject *fields, PyObject *order, PyObject *body_obj,
                       char *out, int *failed) {
    if (body_obj == Py_None) return hmac_b64(key, fields, order, NULL, out, failed);
    Py_buffer body;
    if (PyObject_GetBuffer(body_obj, &body, PyBUF_SIMPLE) < 0) return -1;
    int rc = hmac_b64(key, fields, order, &body, out, failed);
    PyBuffer_Release(&body);
    return rc;
}

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
    char out[28];
    int failed = 0;
    if (hmac_b64_of(key, fields, order, body_obj, out, &failed) < 0) return NULL;
    if (failed) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(out, 28);
}

static PyObject *str_access_key, *str_signature, *str_security_token;

/* The signing order of `fields` from `orders` (a borrowed tuple), NULL with no exception when
 * not cached (or not of the expected shape). */
static PyObject *cached_order(PyObject *fields, PyObject *orders) {
    Py_ssize_t n = PyDict_GET_SIZE(fields), pos = 0, i = 0;
    PyObject *keys = PyTuple_New(n), *k, *v;
    if (keys == NULL) return NULL;
    while (i < n && PyDict_Next(fields, &pos, &k, &v)) {
        Py_INCREF(k);
        PyTuple_SET_ITEM(keys, i, k);
        i++;
    }
    PyObject *entry = i == n ? PyDict_GetItemWithError(orders, keys) : NULL;
    Py_DECREF(keys);
    if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2) return NULL;
    PyObject *order = PyTuple_GET_ITEM(entry, 0);
    return PyTuple_Check(order) ? order : NULL;
}

static PyObject *check_signed(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "check_signed(fields, body, code, secrets, granted, field_codes, orders)");
        return NULL;
    }
    PyObject *fields = args[0], *body_obj = args[1], *code = args[2], *secrets = args[3];
    PyObject *granted = args[4], *field_codes = args[5], *orders = args[6];
    if (!PyDict_Check(fields) || !PyDict_Check(secrets) || !PyAnySet_Check(granted) ||
        !PyDict_Check(field_codes) || !PyDict_Check(orders)) {
        PyErr_SetString(PyExc_TypeError,
                        "check_signed(dict, body, int, dict, set, dict, dict)");
        return NULL;
    }
    /* Strong references to what is used after a later lookup: a lookup may run Python code
     * (a str subclass's __eq__) that changes the dicts. */
    PyObject *field = NULL, *ak = NULL, *secret = NULL, *given = NULL, *order = NULL;
    PyObject *result = NULL;
    field = PyDict_GetItemWithError(field_codes, code);
    if (field == NULL) goto slow;
    Py_INCREF(field);
    ak = PyDict_GetItemWithError(fields, str_access_key);
    if (ak == NULL || !PyUnicode_Check(ak)) goto slow;
    Py_INCREF(ak);
    secret = PyDict_GetItemWithError(secrets, ak);
    if (secret == NULL || !PyBytes_Check(secret)) goto slow;
    Py_INCREF(secret);
    given = PyDict_GetItemWithError(fields, str_signature);
    if (given == NULL || !PyUnicode_Check(given)) goto slow;
    Py_INCREF(given);
    PyObject *value = PyDict_GetItemWithError(fields, field);
    if (value == NULL && PyErr_Occurred()) goto done;
    PyObject *grant = PyTuple_Pack(3, ak, code, value == NULL ? Py_None : value);
    if (grant == NULL) goto done;
    int known = PySet_Contains(granted, grant);
    Py_DECREF(grant);
    if (known < 0) goto done;
    if (!known) goto slow;
    order = cached_order(fields, orders);
    if (order == NULL) goto slow;
    Py_INCREF(order);
    Py_ssize_t glen;
    const char *g = PyUnicode_AsUTF8AndSize(given, &glen);
    if (g == NULL) {
        PyErr_Clear();
        goto slow;
    }
    char mac[28];
    int failed = 0;
    if (hmac_b64_of(secret, fields, order, body_obj, mac, &failed) < 0) goto done;
    /* The length of a signature is no secret; its bytes are compared in constant time. */
    result = failed || glen != 28 || CRYPTO_memcmp(g, mac, 28) != 0 ? Py_False : Py_True;
    Py_INCREF(result);
    goto done;
slow:
    if (!PyErr_Occurred()) {
        result = Py_False;
        Py_INCREF(result);
    }
done:
    Py_XDECREF(field);
    Py_XDECREF(ak);
    Py_XDECREF(secret);
    Py_XDECREF(given);
    Py_XDECREF(order);
    return result;
}

static PyObject *sign_fields(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "sign_fields(key, access_key, token, fields, body, orders)");
        return NULL;
    }
    PyObject *key = args[0], *ak = args[1], *token = args[2], *fields = args[3];
    PyObject *body_obj = args[4], *orders = args[5];
    if (!PyBytes_Check(key) || !PyUnicode_Check(ak) || (token != Py_None && !PyUnicode_Check(token)) ||
        (fields != Py_None && !PyDict_Check(fields)) || !PyDict_Check(orders)) {
        PyErr_SetString(PyExc_TypeError,
                        "sign_fields(bytes, str, str | None, dict | None, body, dict)");
        return NULL;
    }
    PyObject *out = fields == Py_None ? PyDict_New() : PyDict_Copy(fields);
    if (out == NULL) return NULL;
    /* As RequestSigner.sign_fields: no Signature, then AccessKey (and SecurityToken) set. */
    if (PyDict_Contains(out, str_signature) == 1 && PyDict_DelItem(out, str_signature) < 0) goto error;
    if (PyErr_Occurred()) goto error;
    if (PyDict_SetItem(out, str_access_key, ak) < 0) goto error;
    if (token != Py_None && PyDict_SetItem(out, str_security_token, token) < 0) goto error;
    PyObject *order = cached_order(out, orders);
    if (order == NULL) {
        if (PyErr_Occurred()) goto error;
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    char mac[28];
    int failed = 0;
    Py_INCREF(order); /* the lookups below may run Python code that empties `orders` */
    int hrc = hmac_b64_of(key, out, order, body_obj, mac, &failed);
    Py_DECREF(order);
    if (hrc < 0) goto error;
    if (failed) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    PyObject *sig = PyUnicode_FromStringAndSize(mac, 28);
    if (sig == NULL) goto error;
    int rc = PyDict_SetItem(out, str_signature, sig);
    Py_DECREF(sig);
    if (rc < 0) goto error;
    return out;
error:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"hmac_sha1_b64", (PyCFunction)(void (*)(void))hmac_sha1_b64, METH_FASTCALL,
     "Base64 of HMAC-SHA1(key, UTF-8 of fields[k] for k in order, then body); None: use the "
     "Python path."},
    {"check_signed", (PyCFunction)(void (*)(void))check_signed, METH_FASTCALL,
     "True: a remembered grant and a valid signature; False: let the Python checker decide."},
    {"sign_fields", (PyCFunction)(void (*)(void))sign_fields, METH_FASTCALL,
     "RequestSigner.sign_fields natively; None: use the Python path."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "common.acl_native", "RocketMQ's ACL signature, natively.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_acl_native(void) {
    str_access_key = PyUnicode_InternFromString("AccessKey");
    str_signature = PyUnicode_InternFromString("Signature");
    str_security_token = PyUnicode_InternFromString("SecurityToken");
    if (str_access_key == NULL || str_signature == NULL || str_security_token == NULL) return NULL;
    return PyModule_Create(&module);
}
