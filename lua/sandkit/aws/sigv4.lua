--- The name docs/sigv4.md gave the SigV4 signer before the aws provider's folder held it: code
-- that requires it by that name gets the same module.
return require "sandkit.providers.aws.sigv4"
