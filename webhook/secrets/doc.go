// Package secrets keeps the apps' webhook secrets in Kubernetes Secrets and answers
// the webhook handler's lookups (it implements webhook.Apps).
//
// An app's webhook secret is the key that spec.git.webhookSecretRef names; bex
// makes the Secret "<app>-webhook" with key "secret", owned by the App so that it
// goes with it. A rotation writes a new value under that key and keeps the one it
// replaces under "<key>.previous", valid until the time in the annotation
// app.bex.co/previous-expires (24 hours, time enough to update the git host) or
// until it is dropped: during that window deliveries signed with either verify.
package secrets
