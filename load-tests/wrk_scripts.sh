# wrk Lua request scripts shared by load-tests/topn_cost.sh and
# load-tests/request_instructions.sh (sourced, not run).

# The ids of FILE (first column) as a Lua table of strings.
lua_list() { awk 'BEGIN { printf "{" } { printf "%s\"%s\"", (NR > 1 ? "," : ""), $1 } END { print "}" }' "$1"; }

# Writes to OUT a wrk script that asks, as the admin key KEY, for the top-N (KIND topn,
# n=10) or the predictions of 10 random items of ITEMS (KIND pred) of random users of
# USERS (files of ids, one per line; seeded, so two runs ask the same).
random_requests_lua() { # OUT USERS ITEMS KIND KEY
    cat >"$1" <<LUA
math.randomseed(42)
wrk.headers["Authorization"] = "Bearer $5"
local users = $(lua_list "$2")
local items = $(lua_list "$3")
request = function()
  local u = users[math.random(#users)]
  if "$4" == "topn" then
    return wrk.format("GET", "/v1/users/" .. u .. "/recommendations?n=10")
  end
  local pick = {}
  for k = 1, 10 do pick[k] = items[math.random(#items)] end
  return wrk.format("GET", "/v1/users/" .. u .. "/predictions?items=" .. table.concat(pick, ","))
end
LUA
}
