-- wrk script: POST the body in the file named by BODY (env), path by PATH_ (env).
local f = assert(io.open(os.getenv("BODY"), "rb"))
wrk.body = f:read("*a")
f:close()
wrk.method = "POST"
wrk.path = os.getenv("URL_PATH")
wrk.headers["Content-Type"] = "application/json"
local hl = os.getenv("HEADER_LENGTH")
if hl and hl ~= "" then wrk.headers["Inference-Header-Content-Length"] = hl end
