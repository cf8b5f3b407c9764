package releases

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// EnvDefault is a config var app.json's env gives (Heroku's and Dokku's): set on
// the App's first deploy where the App does not set it; never over a value
// already set.
type EnvDefault struct {
	Name  string
	Value string
	// Secret: the value is a secret made for the app (Heroku's generator
	// "secret"), 64 hex digits from crypto/rand; Value is not read.
	Secret bool
}

// secretBytes are the random bytes of a generated secret: 64 hex digits, as
// Dokku's generator makes (Heroku's is as long).
const secretBytes = 32

// withSecrets returns defs with every Secret's value made, once per Record, so
// that the release command and the release recorded after it see the same one.
// The values are never logged: they are config vars.
func withSecrets(defs []EnvDefault) ([]EnvDefault, error) {
	if !slices.ContainsFunc(defs, func(d EnvDefault) bool { return d.Secret }) {
		return defs, nil
	}
	out := slices.Clone(defs)
	for i := range out {
		if !out[i].Secret {
			continue
		}
		b := make([]byte, secretBytes)
		if _, err := rand.Read(b); err != nil {
			return nil, fmt.Errorf("generating the secret %s: %w", out[i].Name, err)
		}
		out[i].Value = hex.EncodeToString(b)
	}
	return out, nil
}

// firstDeploy says whether app has never been deployed: no image yet (config
// vars set before the first push wait in the spec, with no release).
func firstDeploy(app *appv1.App) bool { return app.Spec.Image == "" }

// applyEnvDefaults sets each of defs that env does not set, in defs' order
// after env's, and returns the names it set.
func applyEnvDefaults(env []appv1.EnvVar, defs []EnvDefault) ([]appv1.EnvVar, []string) {
	var set []string
	for _, d := range defs {
		if slices.ContainsFunc(env, func(e appv1.EnvVar) bool { return e.Name == d.Name }) {
			continue
		}
		env = append(env, appv1.EnvVar{Name: d.Name, Value: d.Value})
		set = append(set, d.Name)
	}
	return env, set
}
