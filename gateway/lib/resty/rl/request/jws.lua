-- resty.rl.request.jws: JWT signatures with public keys, RS256 (RSASSA-PKCS1-v1_5
-- with SHA-256) and ES256 (ECDSA P-256 with SHA-256), verified by the
-- OpenSSL that nginx (and Kong) already link, through LuaJIT's FFI
-- (EVP_DigestVerify, OpenSSL 1.1.1 or later). HS256 stays in
-- resty.rl.request.identity (HMAC).
--
-- A key is a PEM "PUBLIC KEY" (SubjectPublicKeyInfo), read once when the
-- policy is compiled; the algorithm is the configuration's, never the
-- token's (a token whose header names another `alg` is refused), so a
-- public key can never be used as an HMAC secret.

local ffi = require "ffi"

local _M = {}

-- One declaration a call: another library of the process (resty.rl.request.identity,
-- lua-resty-openssl under Kong) may have declared some already.
for _, decl in ipairs({
    "typedef struct evp_md_st EVP_MD;",
    "const EVP_MD *EVP_sha256(void);",
    "typedef struct bio_st BIO;",
    "typedef struct evp_pkey_st EVP_PKEY;",
    "typedef struct evp_md_ctx_st EVP_MD_CTX;",
    "typedef struct evp_pkey_ctx_st EVP_PKEY_CTX;",
    "typedef struct engine_st ENGINE;",
    "typedef struct ECDSA_SIG_st ECDSA_SIG;",
    "typedef struct bignum_st BIGNUM;",
    "BIO *BIO_new_mem_buf(const void *buf, int len);",
    "int BIO_free(BIO *a);",
    "EVP_PKEY *PEM_read_bio_PUBKEY(BIO *bp, EVP_PKEY **x, void *cb, void *u);",
    "void EVP_PKEY_free(EVP_PKEY *pkey);",
    "EVP_MD_CTX *EVP_MD_CTX_new(void);",
    "void EVP_MD_CTX_free(EVP_MD_CTX *ctx);",
    "int EVP_DigestVerifyInit(EVP_MD_CTX *ctx, EVP_PKEY_CTX **pctx, const EVP_MD *type, "
        .. "ENGINE *e, EVP_PKEY *pkey);",
    "int EVP_DigestVerify(EVP_MD_CTX *ctx, const unsigned char *sig, size_t siglen, "
        .. "const unsigned char *tbs, size_t tbslen);",
    "ECDSA_SIG *ECDSA_SIG_new(void);",
    "void ECDSA_SIG_free(ECDSA_SIG *sig);",
    "int ECDSA_SIG_set0(ECDSA_SIG *sig, BIGNUM *r, BIGNUM *s);",
    "BIGNUM *BN_bin2bn(const unsigned char *s, int len, BIGNUM *ret);",
    "void BN_free(BIGNUM *a);",
    "int i2d_ECDSA_SIG(const ECDSA_SIG *sig, unsigned char **pp);",
    "void CRYPTO_free(void *ptr, const char *file, int line);",
}) do
    pcall(ffi.cdef, decl)
end

local C = ffi.C

--- The algorithms verified here.
_M.ALGS = { RS256 = true, ES256 = true }

--- A public key from PEM text (kept for the life of the worker), or nil
--- and an error.
function _M.load_key(pem)
    if type(pem) ~= "string" or pem == "" then
        return nil, "no PEM text"
    end
    local bio = C.BIO_new_mem_buf(pem, #pem)
    if bio == nil then
        return nil, "out of memory"
    end
    local key = C.PEM_read_bio_PUBKEY(bio, nil, nil, nil)
    C.BIO_free(bio)
    if key == nil then
        return nil, "not a PEM public key (-----BEGIN PUBLIC KEY-----)"
    end
    return ffi.gc(key, C.EVP_PKEY_free)
end

-- The DER form OpenSSL verifies of a JWS ES256 signature (r and s, 32
-- bytes each, big-endian), or nil.
local function ecdsa_der(raw)
    if #raw ~= 64 then
        return nil
    end
    local sig = C.ECDSA_SIG_new()
    if sig == nil then
        return nil
    end
    local r = C.BN_bin2bn(raw, 32, nil)
    local s = C.BN_bin2bn(ffi.cast("const unsigned char *", raw) + 32, 32, nil)
    if r == nil or s == nil or C.ECDSA_SIG_set0(sig, r, s) ~= 1 then
        if r ~= nil then C.BN_free(r) end
        if s ~= nil then C.BN_free(s) end
        C.ECDSA_SIG_free(sig)
        return nil
    end
    local out = ffi.new("unsigned char *[1]")
    local len = C.i2d_ECDSA_SIG(sig, out)
    C.ECDSA_SIG_free(sig)
    if len <= 0 then
        return nil
    end
    local der = ffi.string(out[0], len)
    C.CRYPTO_free(out[0], "jws.lua", 0)
    return der
end

--- True when `sig` (the decoded signature bytes) is `alg`'s signature of
--- `signed` (the token's `header.payload`) by `key` (load_key).
function _M.verify(alg, key, signed, sig)
    if alg == "ES256" then
        sig = ecdsa_der(sig)
        if not sig then
            return false
        end
    elseif alg ~= "RS256" then
        return false
    end
    local ctx = C.EVP_MD_CTX_new()
    if ctx == nil then
        return false
    end
    local ok = C.EVP_DigestVerifyInit(ctx, nil, C.EVP_sha256(), nil, key) == 1
        and C.EVP_DigestVerify(ctx, sig, #sig, signed, #signed) == 1
    C.EVP_MD_CTX_free(ctx)
    return ok
end

return _M
