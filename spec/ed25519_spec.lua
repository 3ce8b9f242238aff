-- Ed25519 in the C core (core.ed25519_key, core.ed25519_verify): RFC 8032's test vectors, and
-- capability tokens checked both ways against Debian's python3-cryptography.

local core = require "sandkit.core"
local capability = require "sandkit.providers.kubernetes.capability"
local files = require "support.files"

local PYTHON = "/usr/bin/python3"

local function unhex(h)
  return (h:gsub("..", function(x) return string.char(tonumber(x, 16)) end))
end

local function hex(s)
  return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

--- The PKCS#8 PEM of an Ed25519 private key given as its 32-byte seed (RFC 8410 §7).
local function pem_of_seed(seed)
  return "-----BEGIN PRIVATE KEY-----\n" .. core.b64encode(unhex("302e020100300506032b657004220420") .. seed)
    .. "\n-----END PRIVATE KEY-----\n"
end

-- RFC 8032 §7.1: TEST 1, TEST 2, TEST 3, TEST 1024 (a 1023-byte message) and TEST SHA(abc).
local VECTORS = {
  { secret = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
    public = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", message = "",
    signature = "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
      .. "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b" },
  { secret = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
    public = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", message = "72",
    signature = "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
      .. "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00" },
  { secret = "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
    public = "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", message = "af82",
    signature = "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac"
      .. "18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a" },
  { secret = "f5e5767cf153319517630f226876b86c8160cc583bc013744c6bf255f5cc0ee5",
    public = "278117fc144c72340f67d0f2316e8386ceffbf2b2428c9c51fef7c597f1d426e",
    message = table.concat{
      "08b8b2b733424243760fe426a4b54908632110a66c2f6591eabd3345e3e4eb98",
      "fa6e264bf09efe12ee50f8f54e9f77b1e355f6c50544e23fb1433ddf73be84d8",
      "79de7c0046dc4996d9e773f4bc9efe5738829adb26c81b37c93a1b270b20329d",
      "658675fc6ea534e0810a4432826bf58c941efb65d57a338bbd2e26640f89ffbc",
      "1a858efcb8550ee3a5e1998bd177e93a7363c344fe6b199ee5d02e82d522c4fe",
      "ba15452f80288a821a579116ec6dad2b3b310da903401aa62100ab5d1a36553e",
      "06203b33890cc9b832f79ef80560ccb9a39ce767967ed628c6ad573cb116dbef",
      "efd75499da96bd68a8a97b928a8bbc103b6621fcde2beca1231d206be6cd9ec7",
      "aff6f6c94fcd7204ed3455c68c83f4a41da4af2b74ef5c53f1d8ac70bdcb7ed1",
      "85ce81bd84359d44254d95629e9855a94a7c1958d1f8ada5d0532ed8a5aa3fb2",
      "d17ba70eb6248e594e1a2297acbbb39d502f1a8c6eb6f1ce22b3de1a1f40cc24",
      "554119a831a9aad6079cad88425de6bde1a9187ebb6092cf67bf2b13fd65f270",
      "88d78b7e883c8759d2c4f5c65adb7553878ad575f9fad878e80a0c9ba63bcbcc",
      "2732e69485bbc9c90bfbd62481d9089beccf80cfe2df16a2cf65bd92dd597b07",
      "07e0917af48bbb75fed413d238f5555a7a569d80c3414a8d0859dc65a46128ba",
      "b27af87a71314f318c782b23ebfe808b82b0ce26401d2e22f04d83d1255dc51a",
      "ddd3b75a2b1ae0784504df543af8969be3ea7082ff7fc9888c144da2af58429e",
      "c96031dbcad3dad9af0dcbaaaf268cb8fcffead94f3c7ca495e056a9b47acdb7",
      "51fb73e666c6c655ade8297297d07ad1ba5e43f1bca32301651339e22904cc8c",
      "42f58c30c04aafdb038dda0847dd988dcda6f3bfd15c4b4c4525004aa06eeff8",
      "ca61783aacec57fb3d1f92b0fe2fd1a85f6724517b65e614ad6808d6f6ee34df",
      "f7310fdc82aebfd904b01e1dc54b2927094b2db68d6f903b68401adebf5a7e08",
      "d78ff4ef5d63653a65040cf9bfd4aca7984a74d37145986780fc0b16ac451649",
      "de6188a7dbdf191f64b5fc5e2ab47b57f7f7276cd419c17a3ca8e1b939ae49e4",
      "88acba6b965610b5480109c8b17b80e1b7b750dfc7598d5d5011fd2dcc5600a3",
      "2ef5b52a1ecc820e308aa342721aac0943bf6686b64b2579376504ccc493d97e",
      "6aed3fb0f9cd71a43dd497f01f17c0e2cb3797aa2a2f256656168e6c496afc5f",
      "b93246f6b1116398a346f1a641f3b041e989f7914f90cc2c7fff357876e506b5",
      "0d334ba77c225bc307ba537152f3f1610e4eafe595f6d9d90d11faa933a15ef1",
      "369546868a7f3a45a96768d40fd9d03412c091c6315cf4fde7cb68606937380d",
      "b2eaaa707b4c4185c32eddcdd306705e4dc1ffc872eeee475a64dfac86aba41c",
      "0618983f8741c5ef68d3a101e8a3b8cac60c905c15fc910840b94c00a0b9d0" },
    signature = "0aab4c900501b3e24d7cdf4663326a3a87df5e4843b2cbdb67cbf6e460fec350"
      .. "aa5371b1508f9f4528ecea23c436d94b5e8fcd4f681e30a6ac00a9704a188a03" },
  { secret = "833fe62409237b9d62ec77587520911e9a759cec1d19755b7da901b96dca3d42",
    public = "ec172b93ad5e563bf4932c70e1245034c35467ef2efd4d64ebf819683467e2bf",
    message = "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a"
      .. "2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f",
    signature = "dc2a4459e7369633a52b1bf277839a00201009a3efbf3ecb69bea2186c26b589"
      .. "09351fc9ac90b3ecfdfbc7c66431e0303dca179c138ac17ad9bef1177331a704" },
}

--- Runs a Python program with args; its stdout, or the spec fails with its stderr.
local function python(program, args)
  local dir = files.temp_name()
  files.write(dir .. ".py", program)
  local quoted = {}
  for i, a in ipairs(args or {}) do quoted[i] = files.shell_quote(a) end
  local p = io.popen(PYTHON .. " " .. dir .. ".py " .. table.concat(quoted, " ") .. " 2>" .. dir .. ".err")
  local out = p:read("a")
  local ok = p:close()
  local err = files.read(dir .. ".err") or ""
  os.remove(dir .. ".py")
  os.remove(dir .. ".err")
  os.remove(dir)
  assert(ok, "python failed: " .. err)
  return out
end

describe("Ed25519 in the C core", function()
  it("signs RFC 8032's test vectors to their published signatures from keys loaded as PKCS#8 PEM", function()
    assert.equal(1023, #unhex(VECTORS[4].message), "TEST 1024's message is whole")
    for i, v in ipairs(VECTORS) do
      local key = assert(core.ed25519_key(pem_of_seed(unhex(v.secret))))
      assert.equal(v.public, hex(key:public()), "public key of vector " .. i)
      assert.equal(v.signature, hex(key:sign(unhex(v.message))), "signature of vector " .. i)
    end
  end)

  it("verifies RFC 8032's signatures and refuses each one altered by a bit or for another message", function()
    for i, v in ipairs(VECTORS) do
      local pub, msg, sig = unhex(v.public), unhex(v.message), unhex(v.signature)
      assert.is_true(core.ed25519_verify(pub, msg, sig), "vector " .. i)
      local b = sig:byte(1)
      local flipped = string.char(b % 2 == 0 and b + 1 or b - 1) .. sig:sub(2)
      assert.is_false(core.ed25519_verify(pub, msg, flipped), "altered signature of vector " .. i)
      assert.is_false(core.ed25519_verify(pub, msg .. "x", sig), "other message, vector " .. i)
    end
  end)

  it("refuses a PEM that is not one unencrypted Ed25519 private key, without prompting", function()
    local dir = files.temp_dir()
    assert(files.execute("cd " .. dir .. " && openssl genpkey -algorithm ec -pkeyopt ec_paramgen_curve:P-256"
      .. " -out ec.pem 2>/dev/null && openssl genpkey -algorithm ed25519 -aes-128-cbc -pass pass:x"
      .. " -out encrypted.pem 2>/dev/null"))
    local ec_key, why = core.ed25519_key(files.read(dir .. "/ec.pem"))
    assert.is_nil(ec_key)
    assert.matches("not an Ed25519 key", why)
    local enc, ewhy = core.ed25519_key(files.read(dir .. "/encrypted.pem"))
    assert.is_nil(enc)
    assert.matches("unencrypted", ewhy)
    assert.is_nil((core.ed25519_key("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")))
    -- Past the C core's 16 KiB bound: refused before any parsing.
    local long, lwhy = core.ed25519_key(pem_of_seed(string.rep("k", 32)) .. string.rep("#", 16 * 1024))
    assert.is_nil(long)
    assert.matches("over 16384 bytes", lwhy)
    core.remove_tree(dir)
  end)

  it("refuses public keys and signatures of the wrong length as misuse", function()
    assert.has_error(function() core.ed25519_verify(string.rep("a", 31), "m", string.rep("s", 64)) end)
    assert.has_error(function() core.ed25519_verify(string.rep("a", 32), "m", string.rep("s", 63)) end)
  end)
end)

describe("a capability token", function()
  local VERIFY = [[
import base64, json, sys
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
def unb64url(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
pub, token = sys.argv[1], sys.argv[2]
payload, sig = token.split(".")
Ed25519PublicKey.from_public_bytes(base64.b64decode(pub)).verify(unb64url(sig), payload.encode("ascii"))
print(json.dumps(json.loads(unb64url(payload)), sort_keys=True))
]]

  local SIGN = [[
import base64, json, sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode("ascii")
key = Ed25519PrivateKey.generate()
claims = {"sessionId": sys.argv[1], "operation": "execute", "generation": 1,
          "expiresAt": int(sys.argv[2]), "keyId": "py"}
payload = b64url(json.dumps(claims, separators=(",", ":")).encode())
token = payload + "." + b64url(key.sign(payload.encode("ascii")))
pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                        serialization.NoEncryption()).decode()
print(json.dumps({"token": token, "public": base64.b64encode(pub).decode(), "pem": pem}))
]]

  it("minted by sandkit verifies under python3-cryptography and carries exactly the documented claims", function()
    local key = assert(core.ed25519_key(pem_of_seed(core.random(32))))
    local minter = capability.minter{ key = key, key_id = "k1", lifetime = 300, now = function() return 1700000000 end }
    local token = minter:token("6f1c2a3e-0b9d-4c57-9e0a-2d3f4b5c6d7e")
    assert.matches("^[%w%-_]+%.[%w%-_]+$", token)
    local out = python(VERIFY, { core.b64encode(key:public()), token })
    assert.equal('{"expiresAt": 1700000300, "generation": 1, "keyId": "k1", "operation": "execute", '
      .. '"sessionId": "6f1c2a3e-0b9d-4c57-9e0a-2d3f4b5c6d7e"}\n', out)
  end)

  it("minted by python3-cryptography verifies in the C core, and its key signs alike in sandkit", function()
    local made = require("cjson").decode(python(SIGN, { "pod-uid", "1700000300" }))
    local payload, sig = made.token:match("^([^.]+)%.([^.]+)$")
    local raw_sig = core.b64decode((sig:gsub("[-_]", { ["-"] = "+", ["_"] = "/" }) .. "=="))
    assert.is_true(core.ed25519_verify(core.b64decode(made.public), payload, raw_sig))
    -- Ed25519 is deterministic: the same key over the same payload gives the same signature.
    local key = assert(core.ed25519_key(made.pem))
    assert.equal(made.public, core.b64encode(key:public()))
    assert.equal(made.token, payload .. "." .. capability.b64url(key:sign(payload)))
  end)

  it("is kept while a minute or more of it remains and minted again under that, or for another pod", function()
    local key = assert(core.ed25519_key(pem_of_seed(core.random(32))))
    local clock = 1000
    local minter = capability.minter{ key = key, key_id = "k1", lifetime = 300, now = function() return clock end }
    local first, expires = minter:token("uid-a")
    assert.equal(1300, expires)
    clock = 1240 -- 60 s left
    assert.equal(first, (minter:token("uid-a")))
    clock = 1241 -- under a minute left: minted again
    local second, later = minter:token("uid-a")
    assert.are_not.equal(first, second)
    assert.equal(1541, later)
    local other = minter:token("uid-b")
    assert.are_not.equal(second, other)
  end)

  it("lives at most 900 seconds whatever lifetime is asked for", function()
    local key = assert(core.ed25519_key(pem_of_seed(core.random(32))))
    local minter = capability.minter{ key = key, key_id = "k1", lifetime = 86400, now = function() return 0 end }
    local _, expires = minter:token("uid")
    assert.equal(900, expires)
  end)
end)
