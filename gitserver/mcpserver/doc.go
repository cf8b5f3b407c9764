// Package mcpserver is bex's API for AI agents: an MCP server (the official Go
// SDK, streamable HTTP at /mcp) whose tools do what the ssh commands do, as a
// front-end of the same backend (gitserver/backend: its operations, access rules
// and view types): list_apps, app_status, deploy, rollback, suspend, resume,
// set_config, scale, releases, logs and build_logs; the managed databases'
// databases, create_database, link_database and unlink_database (app_status
// names an app's linked databases).
//
// Every call carries a bearer token made by `tokens:create` (the backend verifies it); it
// acts as its User, read again on each request, so an agent may touch exactly the
// apps its user may (within the token's scope, below). A token of the wrong shape is refused before any read of the
// API (the backend's token store checks it first), and the tokens that fail are
// limited per source address (internal/sourcelimit; 429 with Retry-After past
// it, for every request of that source), the source being r.RemoteAddr. Every tool result says what happened in one sentence (the
// text content, for the model) and in structured fields (for programs). A refusal
// is a tool error (isError) whose one text content is "CODE: MESSAGE", for example
// `not_found: no app "shop": apps:list shows the apps you can use`, CODE one of not_found,
// forbidden, invalid, conflict, failed (a build or rollout that did not serve) or
// internal, so that an agent can tell "retry" from "ask a human". A tool error has
// no structured content: the output schema describes the tool's result, and a
// client that checks structured content against it (the official TypeScript SDK
// does) would otherwise throw instead of handing the error on.
//
// A token may be limited (tokens:create --apps, --read-only: its scope, which
// the backend enforces for every front-end). Each tool says once, where it is
// registered, whether it reads or changes (addTool's effect; its annotation
// readOnlyHint), and tools/list shows a read-only token the reading tools only
// (a receiving middleware, per request: the list depends on the token, and is
// marked private to the client's cache). Hiding is for the agent's sake: a
// changing tool called by name anyway is refused forbidden by the backend. A
// token limited to some apps is listed every tool and refused, forbidden, any
// other app it names; list_apps shows it its apps only.
//
// A call still running is checked again every Config.Recheck (Server.watch,
// through backend.Recheck): when its user is removed, demoted or taken off an app
// the call works on, the call's context ends and its result is the forbidden
// error saying why.
//
// What an app or its build printed is untrusted data (output.go, package
// untrusted): logs' and build_logs' log, run's output and the tail of a verdict
// (a crash loop's last log lines in a rollout's failure, a failed build step's
// last output: a verdict's log_tail) reach the agent without terminal escapes and control
// characters, with each of the app's config values of 8 or more characters
// masked as "[redacted: NAME]" (backend.ConfigValues, read for that alone),
// inside a block that says it is the app's output and no instructions, in the
// structured field and the text content alike; those tools' descriptions say
// so. No tool returns a config value: set_config and link_database say the
// vars' names. The owner's ssh logs are unchanged: the output is theirs.
//
// The tools that make a release (deploy, deploy_image, set_config, rollback;
// scale makes none) end with a Verdict (verdict.go): status (live, rejected,
// failed, timeout), phase (fetch, build, release, health, rollout), the release
// made and the one serving after, url, duration_s, exit_code where there is
// one, log_tail (at most 40 lines the failing build step or instance printed,
// untrusted), message and hint (what to do next), at most 8 KiB (the tail cut
// first). On success it is the structured content (in Deployed); on failure
// the tool error's text is "CODE: " and exactly the verdict's JSON, CODE the
// error's kind as for every refusal: the one exception to "CODE: MESSAGE",
// for clients that drop an error's structured content. judge is the one
// mapping: a refusal by its kind, a change that ran by where the pipeline or
// the backend marked it stopped (backend.StopOf); serving_release is the
// App's status.revision read after the failure.
//
// Deploys run through the backend's Deployer, the gitserver's push pipeline and
// per-app lock, as a push or a webhook does. toolError is the one mapping of the
// backend's error kinds to tool errors.
package mcpserver
