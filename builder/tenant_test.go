package builder_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"bex.co/bex/builder"
)

// testUID is the App uid the tests' requests carry: one per app name, as the API
// server gives one per App.
// uidSalts holds a random number per test (its testing.TB): the apps of one run
// of a test keep their uids from build to build, and a repeated run
// (go test -count=N) has apps of its own, whose steps and cache mounts are new to
// the shared buildkitd as the first run's were.
var uidSalts sync.Map

func testUID(t testing.TB, app string) string {
	salt, _ := uidSalts.LoadOrStore(t, rand.Uint32())
	return fmt.Sprintf("%08x-%04x-4000-8000-000000000000", fnv32(app), salt.(uint32)&0xffff)
}

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := range len(s) {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}

// requestFor is a request of app, with a uid of its own (uid "" keeps testUID's).
func requestFor(r *repo, app, uid string) builder.Request {
	req := r.request(app)
	if uid != "" {
		req.AppUID = uid
	}
	return req
}

// printed is what the build's steps printed: the output lines, without the steps'
// own lines (which quote their commands).
func printed(out string) string {
	var b strings.Builder
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "       ") {
			b.WriteString(strings.TrimSpace(line) + "\n")
		}
	}
	return b.String()
}

// stepLine is the progress line of the step whose text holds marker.
func stepLine(t *testing.T, out, marker string) string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "-----> [") && strings.Contains(line, marker) {
			return line
		}
	}
	t.Fatalf("no step %q in the output:\n%s", marker, out)
	return ""
}

// The attack: bob's build writes a script into a cache mount; alice's build, whose
// Dockerfile fetches a "dependency" into the same path only when it is missing,
// would ship it. Each app's cache mounts are its own, whatever id the Dockerfile
// names, so alice's build fetches the honest one; bob's own next build does find
// what bob left (the cache mount is kept: the attack would have worked on a shared
// one).
func TestACacheMountIsTheAppsOwn(t *testing.T) {
	b, _ := newBuilder(t)
	for i, tc := range []struct{ name, mount string }{
		{"default id", "--mount=type=cache,target=/root/.cache/deps"},
		{"explicit id", "--mount=type=cache,id=deps,target=/root/.cache/deps"},
		{"explicit id, locked", "--mount=type=cache,id=deps,sharing=locked,target=/root/.cache/deps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A nonce makes each subtest's steps new to buildkitd.
			nonce := fmt.Sprintf("%x", fnv32(t.Name()))
			plant := fmt.Sprintf("FROM busybox\nRUN %s echo 'echo PLANTED-BY-BOB' > /root/.cache/deps/dep.sh && echo planted %s\n", tc.mount, nonce)
			fetch := func(n int) string {
				return fmt.Sprintf("FROM busybox\n"+
					"RUN %s if [ -f /root/.cache/deps/dep.sh ]; then echo from-cache; else echo 'echo honest dependency' > /root/.cache/deps/dep.sh; fi && cp /root/.cache/deps/dep.sh /dep.sh && echo \"ships: $(sh /dep.sh)\" && echo %s-%d\n",
					tc.mount, nonce, n)
			}
			// Apps of their own per case: two cases' explicit ids are one id.
			bobApp, aliceApp := fmt.Sprintf("bob%d", i), fmt.Sprintf("alice%d", i)
			bob := newRepo(t, map[string]string{"Dockerfile": plant})
			_, out := mustBuild(t, b, requestFor(bob, bobApp, ""))
			if !strings.Contains(printed(out), "planted "+nonce) {
				t.Fatalf("bob's step did not run:\n%s", out)
			}

			alice := newRepo(t, map[string]string{"Dockerfile": fetch(1)})
			_, out = mustBuild(t, b, requestFor(alice, aliceApp, ""))
			if p := printed(out); strings.Contains(p, "PLANTED") || strings.Contains(p, "from-cache") || !strings.Contains(p, "ships: honest dependency") {
				t.Fatalf("alice's build reached bob's cache:\n%s", out)
			}

			// Control: each app's next build sees what it left in its own cache.
			alice.commit(map[string]string{"Dockerfile": fetch(2)})
			_, out = mustBuild(t, b, requestFor(alice, aliceApp, ""))
			if p := printed(out); !strings.Contains(p, "from-cache") || !strings.Contains(p, "ships: honest dependency") {
				t.Fatalf("alice's second build did not find its own cache:\n%s", out)
			}
			bob.commit(map[string]string{"Dockerfile": fetch(3)})
			_, out = mustBuild(t, b, requestFor(bob, bobApp, ""))
			if p := printed(out); !strings.Contains(p, "from-cache") || !strings.Contains(p, "ships: PLANTED-BY-BOB") {
				t.Fatalf("bob's second build did not find bob's cache:\n%s", out)
			}
		})
	}
}

// The cache is the App's uid's, not its name's: an app made under the name of a
// destroyed one starts with an empty cache.
func TestANewAppUnderAnOldNameDoesNotFindItsCache(t *testing.T) {
	b, _ := newBuilder(t)
	df := func(n int) string {
		return fmt.Sprintf("FROM busybox\nRUN --mount=type=cache,target=/c if [ -f /c/x ]; then echo found-$(cat /c/x); else echo left > /c/x; echo empty; fi && echo reused-name-%d\n", n)
	}
	r := newRepo(t, map[string]string{"Dockerfile": df(1)})
	mustBuild(t, b, requestFor(r, "reused", testUID(t, "reused-first")))
	r.commit(map[string]string{"Dockerfile": df(2)})
	_, out := mustBuild(t, b, requestFor(r, "reused", testUID(t, "reused-second")))
	if p := printed(out); !strings.Contains(p, "empty") || strings.Contains(p, "found-left") {
		t.Fatalf("the new app found the old one's cache:\n%s", out)
	}
	r.commit(map[string]string{"Dockerfile": df(3)})
	_, out = mustBuild(t, b, requestFor(r, "reused", testUID(t, "reused-second")))
	if !strings.Contains(printed(out), "found-left") {
		t.Fatalf("the app's second build did not find its cache:\n%s", out)
	}
}

// The same Dockerfile and context in two apps: a step that mounted a cache ran on
// its app's cache, so its result is never taken for another app's same step. With
// an explicit id or a locked mount, buildkitd leaves the cache id out of the step's
// cache key; the per-app host name keeps the key the app's.
func TestAStepThatMountedACacheIsNotReusedForAnotherApp(t *testing.T) {
	b, _ := newBuilder(t)
	for _, mount := range []string{
		"--mount=type=cache,target=/cache",
		"--mount=type=cache,id=shared-name,target=/cache",
		"--mount=type=cache,id=shared-name,sharing=locked,target=/cache",
		"--mount=type=cache,sharing=private,target=/cache",
	} {
		t.Run(mount, func(t *testing.T) {
			marker := fmt.Sprintf("step-%x", fnv32(t.Name()))
			files := map[string]string{
				"Dockerfile": fmt.Sprintf("FROM busybox\nCOPY app.txt /app.txt\nRUN %s cat /cache/* 2>/dev/null; date > /cache/stamp; echo %s\n", mount, marker),
				"app.txt":    "the same in both apps\n",
			}
			first := newRepo(t, files)
			mustBuild(t, b, requestFor(first, "layers-first", ""))
			// Control: the step is cacheable; its own app's rebuild takes it.
			_, out := mustBuild(t, b, requestFor(first, "layers-first", ""))
			if line := stepLine(t, out, marker); !strings.HasSuffix(line, "CACHED") {
				t.Fatalf("the app's own rebuild ran the step again: %q\n%s", line, out)
			}
			second := newRepo(t, files)
			_, out = mustBuild(t, b, requestFor(second, "layers-second", ""))
			if line := stepLine(t, out, marker); strings.HasSuffix(line, "CACHED") {
				t.Fatalf("the second app took the first app's step: %q\n%s", line, out)
			}
		})
	}
}

// A build starts from base images or its own app's images, never another app's:
// FROM, COPY --from and RUN --mount from= of one are refused with one line that
// names the instruction where buildkitd says which line asked (not for RUN
// --mount from=), and nothing of it reaches the build.
func TestABuildCannotStartFromAnotherAppsImage(t *testing.T) {
	b, _ := newBuilder(t)
	victim := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\nRUN echo VICTIM-CONFIG > /secret\n"})
	vreq := requestFor(victim, "victim", "")
	res, _ := mustBuild(t, b, vreq)
	tag := localName(vreq)
	dgst := res.Image[strings.LastIndex(res.Image, "@"):]
	// In containerd, an image is found by its name: by tag, or by tag and digest.
	byDigest := tag + dgst
	const why = " is another app's image: a build starts from base images or this app's own"
	for _, tc := range []struct {
		name, dockerfile, instruction, named string
	}{
		{"FROM by tag", "FROM " + tag + "\nRUN cat /secret\n", "FROM ", tag},
		{"FROM by tag and digest", "FROM " + byDigest + "\nRUN cat /secret\n", "FROM ", byDigest},
		{"FROM by digest", "FROM " + res.Image + "\nRUN cat /secret\n", "FROM ", res.Image},
		{"FROM in upper case", "FROM " + strings.Replace(tag, "bex.local", "BEX.LOCAL", 1) + "\nRUN cat /secret\n", "FROM ", strings.Replace(tag, "bex.local", "BEX.LOCAL", 1)},
		{"COPY --from", "FROM busybox\nCOPY --from=" + tag + " /secret /secret\nRUN cat /secret\n", "COPY --from=", tag},
		{"RUN --mount from=", "FROM busybox\nRUN --mount=type=bind,from=" + tag + ",target=/v cat /v/secret\n", "", tag},
		{"a stage named after it", "FROM " + tag + " AS base\nFROM busybox\nCOPY --from=base /secret /secret\n", "FROM ", tag},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// "vic": an app whose name starts the victim's is another app too.
			for _, app := range []string{"thief", "vic"} {
				r := newRepo(t, map[string]string{"Dockerfile": tc.dockerfile})
				req := requestFor(r, app, "")
				_, out, err := build(t, b, req)
				want := tc.instruction + tc.named + why
				if tc.instruction == "" {
					// buildkitd names no Dockerfile line: the line names every way in.
					want += " (FROM, COPY --from, RUN --mount from=)"
				}
				if err == nil || err.Error() != want {
					t.Fatalf("%s: err = %v, want %q\n%s", app, err, want, out)
				}
				if strings.Contains(printed(out), "VICTIM-CONFIG") {
					t.Fatalf("the victim's file reached the build:\n%s", out)
				}
				if !strings.Contains(out, " !     "+want+"\n") {
					t.Fatalf("the build log lacks the line:\n%s", out)
				}
			}
		})
	}
	// Control: the victim's own build starts from its earlier image, by tag and
	// by digest.
	victim.commit(map[string]string{"Dockerfile": "FROM " + tag + "\nCOPY --from=" + byDigest + " /secret /again\nRUN cat /secret /again\n"})
	_, out := mustBuild(t, b, requestFor(victim, "victim", ""))
	if strings.Count(printed(out), "VICTIM-CONFIG") < 2 {
		t.Fatalf("the app's own image did not reach its build:\n%s", out)
	}
}

// A `# syntax=` directive, which most Dockerfiles written for BuildKit start with,
// is not followed: the built-in frontend builds (this machine reaches no registry,
// so a pulled frontend would fail the build), and a line says so. BUILDKIT_SYNTAX
// among the app's build arguments is ignored too.
func TestASyntaxDirectiveBuildsWithTheBuiltInFrontend(t *testing.T) {
	b, _ := newBuilder(t)
	r := newRepo(t, map[string]string{"Dockerfile": "# syntax=docker/dockerfile:1\nFROM busybox\nRUN --mount=type=cache,target=/c echo built-with-directive\n"})
	_, out := mustBuild(t, b, r.request("syntax"))
	if !strings.Contains(out, "-----> The Dockerfile's syntax directive (docker/dockerfile:1) is ignored: bex builds with its built-in Dockerfile frontend\n") || !strings.Contains(printed(out), "built-with-directive") {
		t.Fatalf("output:\n%s", out)
	}

	r = newRepo(t, map[string]string{"Dockerfile": "FROM busybox\nRUN echo built-without-directive\n"})
	req := r.request("syntax-arg")
	req.Args = map[string]string{"BUILDKIT_SYNTAX": "docker/dockerfile:1", "BUILDKIT_CACHE_MOUNT_NS": "victim"}
	_, out = mustBuild(t, b, req)
	for _, want := range []string{
		"-----> The build argument BUILDKIT_SYNTAX is bex's own: the app's value is ignored\n",
		"-----> The build argument BUILDKIT_CACHE_MOUNT_NS is bex's own: the app's value is ignored\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(printed(out), "built-without-directive") {
		t.Errorf("the step did not run:\n%s", out)
	}
	if strings.Contains(out, "syntax directive") {
		t.Errorf("a line about a directive the Dockerfile does not have:\n%s", out)
	}
}

func TestABuildWithoutTheAppsUIDIsRefused(t *testing.T) {
	b, _ := newBuilder(t)
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\n"})
	for _, uid := range []string{"", "a/b", "../x"} {
		req := requestFor(r, "nouid", "")
		req.AppUID = uid
		_, err := b.Build(context.Background(), req, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "is not an App's uid") {
			t.Errorf("uid %q: err = %v", uid, err)
		}
	}
}
