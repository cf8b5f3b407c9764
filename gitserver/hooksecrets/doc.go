// Package hooksecrets keeps the apps' webhook secrets in Kubernetes Secrets and says
// which of them verify a delivery now (Store.Valid, for the backend's Hook).
//
// An app's webhook secret is the key that spec.git.webhookSecretRef names, in the
// Secret of that name in the gitserver's secrets namespace (bex gitserver
// --secrets-namespace; by default the apps' namespace, as under bex up). Apps are
// read in the apps' namespace, their Secrets in the secrets namespace: on a
// cluster the gitserver may then touch Secrets of bex-system only, never the apps'
// own (their config vars' passwords).
//
// bex makes the Secret "<app>-webhook" with key "secret", labelled
// app.bex.co/app=<app> and app.bex.co/secret=webhook. In the App's namespace it is
// also owned by the App; an owner reference cannot cross namespaces, so in another
// namespace it has none, and apps:destroy removes it (Delete) — the gitserver, since
// the deployer, which finalizes the App, may read no Secrets.
//
// A rotation writes a new value under that key and keeps the one it replaces under
// "<key>.previous", valid until the time in the annotation
// app.bex.co/previous-expires (24 hours, time enough to update the git host) or
// until it is dropped: during that window deliveries signed with either verify.
//
// Upstreams keeps, in the same namespace, what apps fetch their upstreams with:
// "<app>-deploy-key" (kubernetes.io/ssh-auth, label app.bex.co/secret=deploy-key),
// the app's own ed25519 deploy key, made when first asked for and replaced by a
// rotation; and "<app>-upstream" (kubernetes.io/basic-auth,
// app.bex.co/secret=upstream-credentials), the username and password of its https
// upstream. Both carry the App's uid (app.bex.co/app-uid): one left by an app of
// the same name is not taken for the new app's. Delete removes them with the app.
//
// Registries keeps the registry logins of registry:login, the server's (not an
// app's), in one Secret "bex-registry-logins" (kubernetes.io/dockerconfigjson,
// app.bex.co/secret=registry-logins) of the same namespace: a Docker config.json,
// read by the image importer at each deploy:image pull.
package hooksecrets
