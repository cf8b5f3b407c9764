package releases_test

import (
	"context"
	"regexp"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
)

// TestFirstEnvAppliesOnceAndNeverOverwrites: app.json's env lands on the
// App's first deploy where the App does not set a var (GREETING, set before the
// push, keeps its value); a secret is generated once, and the release command
// sees the value the release records; a later push changes nothing.
func TestFirstEnvAppliesOnceAndNeverOverwrites(t *testing.T) {
	r, c := setup(t)
	f := &fakeOneOffs{}
	r.OneOffs = f
	ctx := context.Background()
	defs := []releases.EnvDefault{{Name: "GREETING", Value: "from app.json"}, {Name: "WEB_CONCURRENCY", Value: "5"}, {Name: "SECRET_KEY", Secret: true}}
	ch := push(digestA, &appv1.Scripts{Release: []string{"./migrate"}}, nil, nil)
	ch.FirstEnv = defs
	if _, err := r.Record(ctx, "hello", ch); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, e := range getApp(t, c, r.Namespace).Spec.Env {
		env[e.Name] = e.Value
	}
	secret := env["SECRET_KEY"]
	if env["GREETING"] != "hi" || env["WEB_CONCURRENCY"] != "5" || !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(secret) || len(env) != 3 {
		t.Fatalf("env after the first deploy: %v", env)
	}
	for _, e := range f.runs[0].Env {
		if e.Name == "SECRET_KEY" && e.Value != secret {
			t.Errorf("the release command saw another secret than the release keeps")
		}
	}

	// A second push: nothing of app.json's env applies, not even to a var
	// unset since.
	if _, err := r.RecordConfig(ctx, "hello", func(env []appv1.EnvVar) []appv1.EnvVar {
		var out []appv1.EnvVar
		for _, e := range env {
			if e.Name != "WEB_CONCURRENCY" {
				out = append(out, e)
			}
		}
		return out
	}, "ana", "Unset WEB_CONCURRENCY", nil); err != nil {
		t.Fatal(err)
	}
	ch = push(digestB, nil, nil, nil)
	ch.FirstEnv = defs
	if _, err := r.Record(ctx, "hello", ch); err != nil {
		t.Fatal(err)
	}
	env = map[string]string{}
	for _, e := range getApp(t, c, r.Namespace).Spec.Env {
		env[e.Name] = e.Value
	}
	if env["SECRET_KEY"] != secret || env["GREETING"] != "hi" || len(env) != 2 {
		t.Errorf("env after a second push: %v", env)
	}
}
