--- The name docs/azure.md gave the Azure data-plane client before the azure provider's folder
-- held it: code that requires it by that name gets the same module.
return require "sandkit.providers.azure.dataplane"
