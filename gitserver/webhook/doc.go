// Package webhook takes signed POSTs from git hosts and CI systems and turns them
// into redeploys: `POST /hooks/<app>` with a GitHub, Gitea/Forgejo, GitLab or bex
// signature over the raw body.
//
// The handler answers at once and works in the background. A push to the app's
// deploy branch (the exact full ref) is queued; `ping` answers 200; anything else
// answers 202 with the reason it does nothing. Per app at most one redeploy runs,
// and the deliveries that arrive meanwhile coalesce into one more, which builds
// whatever is newest when it starts (the Redeployer fetches the branch then). A
// delivery id seen before, or a body seen before with the same signature (a replay
// under a new id), is acknowledged and ignored; a per-app token bucket and a bound on
// the apps waiting keep a flood from queueing without end.
//
// Checks run cheapest-first and never parse what is not authenticated: size (413),
// the app's hook (404: an unknown app and an app without a webhook secret are told
// apart from nothing), the signature (401, no detail on why), then the JSON (400).
// Every rejection is logged with the source address. Bad signatures are counted
// per source (the peer, or the last X-Forwarded-For hop of a trusted proxy): past
// Config.BadSignatureBurst they get 429 and are no longer logged one by one.
//
// It is a front-end of gitserver/backend: the hook lookup (Apps) is the
// backend's Hook, and what a redeploy does (fetch, build, release, wait, move the
// ref) is the backend's Redeploy, the gitserver's push pipeline, so that a webhook
// and a push share one pipeline and one lock per app. statusOf is the one
// mapping of the backend's error kinds to HTTP statuses.
package webhook
