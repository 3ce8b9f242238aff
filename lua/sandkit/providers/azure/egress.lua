--- What a session of the azure provider may reach: the egress a sandbox declares, the data
-- plane's egressPolicy for it, and the comparison that tells whether a session enforces it.

local egress = {}

--- The declared egress, defaulted, or nil and why it is none.
function egress.check(declared)
  if declared == nil then return { mode = "deny" } end
  if type(declared) ~= "table" then return nil, "egress is a table such as { mode = \"deny\" }" end
  if declared.mode == "deny" or declared.mode == "allow" then return declared end
  if declared.mode ~= "allowDomains" then
    return nil, "egress.mode is \"deny\", \"allow\" or \"allowDomains\""
  end
  if type(declared.domains) ~= "table" or #declared.domains == 0 then
    return nil, "allowDomains needs a non-empty domains list"
  end
  for _, domain in ipairs(declared.domains) do
    if type(domain) ~= "string" or not domain:match("^[%w%*][%w%*%.%-]*$") then
      return nil, "a domain is a host name, optionally starting with *."
    end
  end
  return declared
end

--- The data plane's egressPolicy for a declared egress: { mode = "deny" } (the default),
-- { mode = "allow" } or { mode = "allowDomains", domains = { … } }.
function egress.policy(declared)
  local checked, why = egress.check(declared)
  if not checked then error("sandkit: " .. why, 2) end
  if checked.mode == "allow" then return { defaultAction = "Allow" } end
  if checked.mode == "deny" then return { defaultAction = "Deny" } end
  local rules = {}
  for i, domain in ipairs(checked.domains) do rules[i] = { pattern = domain, action = "Allow" } end
  return { defaultAction = "Deny", hostRules = rules }
end

--- A policy as a comparable string: the default action and the host rules as a set. Any other
-- kind of rule was never declared, so it is kept and can only make the policies differ.
function egress.key(policy)
  if type(policy) ~= "table" or type(policy.defaultAction) ~= "string" then return nil end
  local rules = {}
  if policy.hostRules ~= nil then
    if type(policy.hostRules) ~= "table" then return nil end
    for _, rule in ipairs(policy.hostRules) do
      if type(rule) ~= "table" or type(rule.pattern) ~= "string" or type(rule.action) ~= "string" then
        return nil
      end
      rules[#rules + 1] = rule.action:lower() .. " " .. rule.pattern:lower()
    end
  end
  table.sort(rules)
  local other = type(policy.rules) == "table" and #policy.rules or 0
  return policy.defaultAction:lower() .. "|" .. table.concat(rules, ",") .. "|" .. other
end

return egress
