package builder_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"bex.co/bex/builder"
)

// predeployApp is a Dockerfile app whose image runs as 65534 in a directory it
// owns, with an ENV the config overrides, and whose predeploy writes what it saw
// into that directory.
func predeployApp(predeploy string) map[string]string {
	return map[string]string{
		"Dockerfile": "FROM busybox\nRUN mkdir /app && chown 65534 /app\nWORKDIR /app\nUSER 65534\nENV GREETING=image KEPT=yes\nCMD [\"cat\", \"/app/predeployed\"]\n",
		"app.json":   `{"scripts": {"dokku": {"predeploy": ` + jsonString(predeploy) + `}}}`,
	}
}

func jsonString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

// A value no shell could take unquoted: quotes, a newline, substitutions.
const hostileValue = "it's \"quoted\"\n$(echo no) `echo no` ${X:-no}"

func TestPredeployIsTheImagesLastStepWithTheConfigAsItsEnv(t *testing.T) {
	b, bk := newBuilder(t)
	r := newRepo(t, predeployApp(`{ id -u; pwd; echo "$GREETING $KEPT"; printf '%s\n' "$SECRET_VALUE"; } > predeployed`))
	req := r.request("predeploy")
	req.Env = map[string]string{"GREETING": "config", "SECRET_VALUE": hostileValue}
	req.EnvFromSecrets = []string{"FROM_A_SECRET"}
	res, out := mustBuild(t, b, req)
	step := "-----> predeploy (app.json scripts.dokku.predeploy): { id -u; pwd;"
	if !strings.Contains(out, step) || !strings.Contains(out, "Config var FROM_A_SECRET comes from a Secret, which builds do not read: predeploy runs without it") {
		t.Errorf("output:\n%s", out)
	}
	if res.Release != nil || len(res.Predeploy) == 0 {
		t.Errorf("release %q predeploy %q", res.Release, res.Predeploy)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The image's own command (CMD kept) reads what predeploy wrote: as the
	// image's user, in its working directory, the config over the image's env,
	// the value as it was.
	got, code, err := bk.Containerd.Run(ctx, localName(req))
	want := "65534\n/app\nconfig yes\n" + hostileValue
	if err != nil || code != 0 || strings.TrimRight(got, "\n") != want {
		t.Fatalf("the image's command: exit %d, %v:\n%q\nwant\n%q", code, err, got, want)
	}
	// The config vars are not in the image: its env is the Dockerfile's.
	env, _, err := bk.Containerd.Run(ctx, localName(req), "env")
	if err != nil || !strings.Contains(env, "GREETING=image") || strings.Contains(env, "SECRET_VALUE") || strings.Contains(env, "config") {
		t.Errorf("the image's env: %v\n%s", err, env)
	}

	// The same commit again: the Dockerfile's steps come from the cache, and
	// predeploy runs again, as a deploy task does on each deploy.
	req.Env = map[string]string{"GREETING": "again"}
	_, out = mustBuild(t, b, req)
	if !strings.Contains(out, "RUN mkdir /app && chown 65534 /app CACHED") || strings.Contains(out, "predeploy) CACHED") || !strings.Contains(out, step) {
		t.Errorf("a rebuild's output:\n%s", out)
	}
	if got, _, err := bk.Containerd.Run(ctx, localName(req)); err != nil || !strings.Contains(got, "\nagain yes") {
		t.Errorf("after the rebuild: %v %q", err, got)
	}
}

func TestAFailingPredeployFailsTheBuildNamingItsPhase(t *testing.T) {
	b, _ := newBuilder(t)
	r := newRepo(t, predeployApp(`echo migrating; echo "no database" >&2; exit 3`))
	_, out, err := build(t, b, r.request("predeploy-fails"))
	pe, ok := errors.AsType[*builder.PredeployError](err)
	if !ok || !errors.Is(err, builder.ErrPredeployFailed) || pe.Status != 3 ||
		err.Error() != "predeploy (app.json scripts.dokku.predeploy) exited with status 3" {
		t.Fatalf("got %v (%T)\n%s", err, err, out)
	}
	for _, want := range []string{"       migrating\n", "       no database\n", " !     predeploy (app.json scripts.dokku.predeploy) exited with status 3\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "-----> Built ") {
		t.Errorf("an image was made:\n%s", out)
	}

	// A Dockerfile step that fails is the build's failure, not predeploy's,
	// which never ran.
	files := predeployApp("touch predeployed")
	files["Dockerfile"] = "FROM busybox\nRUN exit 4\n"
	r = newRepo(t, files)
	_, out, err = build(t, b, r.request("dockerfile-fails"))
	if err == nil || errors.Is(err, builder.ErrPredeployFailed) || !strings.Contains(err.Error(), "RUN exit 4") || !strings.Contains(err.Error(), "exit code 4") {
		t.Fatalf("got %v\n%s", err, out)
	}
	if strings.Contains(out, "predeploy (app.json") {
		t.Errorf("predeploy ran:\n%s", out)
	}
}
