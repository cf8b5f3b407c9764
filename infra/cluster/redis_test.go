package cluster

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// redisNotesScript is the CGI of the Redis notes app: redis-cli (the real
// client) through REDIS_URL as bex's link gives it
// (redis://default:PASSWORD@HOST:PORT), as a user's app would. Each answer starts
// with [$MARK], the release's config, so that a test knows which config
// answered.
const redisNotesScript = `#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\n'
printf '[%s] ' "${MARK:-}"
cli() { redis-cli --no-auth-warning -u "$REDIS_URL" "$@" 2>&1; }
case "$QUERY_STRING" in
write=[a-z]*)
	v=${QUERY_STRING#write=}
	n=$(cli RPUSH notes "$v")
	case $n in
	[1-9]*) echo "wrote $v" ;;
	*) echo "failed to write $v: $n" ;;
	esac ;;
*)
	echo "notes: $(cli LRANGE notes 0 -1 | paste -sd, -)" ;;
esac
`

// redisNotesDockerfile runs the notes CGI under busybox's httpd, on the Redis
// image the databases run (for its redis-cli), as its redis user.
func redisNotesDockerfile(image string) string {
	return "FROM busybox AS bb\nFROM " + image + "\nCOPY --from=bb /bin/busybox /bin/busybox\n" +
		"COPY --chmod=755 notes.sh /www/cgi-bin/notes\nUSER redis\n" +
		"CMD [\"/bin/busybox\", \"sh\", \"-c\", \"exec /bin/busybox httpd -f -p \\\"$PORT\\\" -h /www\"]\n"
}

// TestManagedRedis: a Redis made with redis:create runs as a StatefulSet of one
// pod, its server not root, from the Redis image hack/cluster-local.sh pushes
// (REDIS_IMAGE in cluster.env, the deployer's --redis-image); an app linked to
// it writes and reads through REDIS_URL, and redis:cli reaches the same data;
// the data outlives the deletion of the server's pod (it is on the
// StatefulSet's claim, which stays the same); an app that is not linked gets no
// answer without the password; destroy is refused while linked, then takes the
// StatefulSet, the Service, the claim, the Secret and the NetworkPolicy.
//
// The NetworkPolicy is checked as the API server holds it (the linked app and
// the database's one-offs only): this node's bridge CNI enforces no
// NetworkPolicy (docs/cluster.md), so an app that is not linked opens a TCP
// connection to the server all the same, and only the password keeps it out;
// with the password it reads the data. That is logged, as
// TestTenantPodIsolation logs what a tenant reaches.
func TestManagedRedis(t *testing.T) {
	image := env["REDIS_IMAGE"]
	if image == "" {
		t.Fatal("cluster.env has no REDIS_IMAGE= (hack/cluster-local.sh up writes it)")
	}
	const db, app, stranger = "cache", "tally", "stranger"
	sts, svc, claim, secret := db+"-redis", db+"-redis", "data-"+db+"-redis-0", "bex-db-"+db
	pod := sts + "-0"
	host := sts + ".default.svc"
	// What an earlier run on the same cluster left (BEX_TEST_CLUSTER_ENV).
	_, _, _ = bex("apps:destroy", app, "--confirm", app)
	_, _, _ = bex("apps:destroy", stranger, "--confirm", stranger)
	_, _, _ = bex("redis:destroy", db, "--confirm", db)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := kubectlRun("", "-n", "default", "get", "databases.app.bex.co,statefulsets,pods,pvc,networkpolicies", "-o", "wide")
			t.Logf("objects:\n%s", out)
			out, _ = kubectlRun("", "-n", "default", "get", "databases.app.bex.co", db, "-o", "yaml")
			t.Logf("%s", out)
			out, _ = kubectlRun("", "-n", "default", "describe", "pod", pod)
			t.Logf("%s", out)
		}
		_, _, _ = bex("apps:destroy", app, "--confirm", app)
		_, _, _ = bex("apps:destroy", stranger, "--confirm", stranger)
		_, _, _ = bex("redis:destroy", db, "--confirm", db)
	})
	testenv.Eventually(t, 3*time.Minute, "no StatefulSet of an earlier run", func() error {
		if out, _ := kubectlRun("", "-n", "default", "get", "statefulset,pvc", sts, claim, "--ignore-not-found", "-o", "name"); strings.TrimSpace(out) != "" {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})

	start := time.Now()
	bexOK(t, "redis:create", db, "--size", volumeSize)
	var in struct {
		Status, Message, Host, Version string
		Port                           int
		Links                          []string
	}
	redisInfo := func() {
		t.Helper()
		if err := json.Unmarshal([]byte(bexOK(t, "redis:info", db, "--json")), &in); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Minute, db+" runs", func() error {
		redisInfo()
		if in.Status != "Running" {
			return fmt.Errorf("%s: %s", in.Status, in.Message)
		}
		return nil
	})
	t.Logf("redis:create to Running: %.1f s", time.Since(start).Seconds())
	if in.Host != host || in.Port != 6379 || in.Version != "7" {
		t.Errorf("redis:info: host %q port %d version %q, want %s 6379 7", in.Host, in.Port, in.Version, host)
	}
	if got := kubectl(t, "-n", "default", "get", "pod", pod, "-o", "jsonpath={.spec.containers[0].image}"); got != image {
		t.Errorf("the server runs %q, want REDIS_IMAGE %q", got, image)
	}
	// The image's entrypoint dropped root: the server (the container's first
	// process) runs as the redis user.
	status := kubectl(t, "-n", "default", "exec", pod, "--", "cat", "/proc/1/status")
	var uids, name string
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			uids = strings.Join(strings.Fields(v), " ")
		}
		if v, ok := strings.CutPrefix(line, "Name:"); ok {
			name = strings.TrimSpace(v)
		}
	}
	redisUID := strings.TrimSpace(kubectl(t, "-n", "default", "exec", pod, "--", "id", "-u", "redis"))
	if !strings.HasPrefix(name, "redis-server") || uids != strings.Repeat(redisUID+" ", 3)+redisUID || redisUID == "0" {
		t.Errorf("the server's process is %q with uids %q, want redis-server as the redis user (%s)", name, uids, redisUID)
	}

	// An app linked to it writes and reads.
	r := newRepo(t, "hello-shell", app)
	r.commit(t, "notes on Redis", map[string]string{"Dockerfile": redisNotesDockerfile(image), "notes.sh": redisNotesScript})
	mustPush(t, r)
	bexOK(t, "redis:link", db, app)
	waitBody(t, app, "/cgi-bin/notes?write=apple", "wrote apple", 3*time.Minute)
	waitBody(t, app, "/cgi-bin/notes", "notes: apple\n", time.Minute)
	redisInfo()
	if len(in.Links) != 1 || in.Links[0] != app {
		t.Errorf("redis:info links %v, want [%s]", in.Links, app)
	}

	// redis:cli reaches the same data.
	out, stderr, err := bexIO([]byte("RPUSH notes banana\nLRANGE notes 0 -1\n"), "redis:cli", db)
	if err != nil || !strings.Contains(string(out), "apple\nbanana") {
		t.Fatalf("redis:cli: %v: %q %s", err, out, stderr)
	}
	waitBody(t, app, "/cgi-bin/notes", "notes: apple,banana\n", time.Minute)

	// The server's pod goes: the StatefulSet makes it again on the same claim,
	// and the data is there.
	podUID := kubectl(t, "-n", "default", "get", "pod", pod, "-o", "jsonpath={.metadata.uid}")
	claimUID := kubectl(t, "-n", "default", "get", "pvc", claim, "-o", "jsonpath={.metadata.uid}")
	lost := time.Now()
	kubectl(t, "-n", "default", "delete", "pod", pod, "--wait=false")
	testenv.Eventually(t, 3*time.Minute, "a new server pod is ready", func() error {
		uid, _ := kubectlRun("", "-n", "default", "get", "pod", pod, "-o", "jsonpath={.metadata.uid}")
		ready, _ := kubectlRun("", "-n", "default", "get", "pod", pod, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if uid == "" || uid == podUID || ready != "True" {
			return fmt.Errorf("pod uid %q ready %q", uid, ready)
		}
		return nil
	})
	waitBody(t, app, "/cgi-bin/notes", "notes: apple,banana\n", time.Minute)
	t.Logf("the app reads the data again %.1f s after the server's pod was deleted", time.Since(lost).Seconds())
	if got := kubectl(t, "-n", "default", "get", "pvc", claim, "-o", "jsonpath={.metadata.uid}"); got != claimUID {
		t.Errorf("the claim changed: %s, was %s", got, claimUID)
	}
	waitBody(t, app, "/cgi-bin/notes?write=cherry", "wrote cherry", time.Minute)

	// The NetworkPolicy lets in the linked app's pods and the database's
	// one-offs only, on Redis's port.
	var np struct {
		Spec struct {
			PodSelector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"podSelector"`
			Ingress []struct {
				From []struct {
					PodSelector *struct {
						MatchExpressions []struct {
							Key, Operator string
							Values        []string
						} `json:"matchExpressions"`
					} `json:"podSelector"`
				} `json:"from"`
				Ports []struct {
					Port int `json:"port"`
				} `json:"ports"`
			} `json:"ingress"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(kubectl(t, "-n", "default", "get", "networkpolicy", secret, "-o", "json")), &np); err != nil {
		t.Fatal(err)
	}
	if sel := np.Spec.PodSelector.MatchLabels; sel["app.bex.co/database"] != db || len(np.Spec.Ingress) != 1 ||
		len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].PodSelector == nil ||
		len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port != 6379 {
		t.Fatalf("NetworkPolicy %s: %+v", secret, np.Spec)
	} else if ex := np.Spec.Ingress[0].From[0].PodSelector.MatchExpressions; len(ex) != 1 || ex[0].Key != "app.bex.co/app" ||
		ex[0].Operator != "In" || strings.Join(ex[0].Values, ",") != db+".db,"+app {
		t.Errorf("NetworkPolicy %s lets in %+v, want app.bex.co/app in (%s.db, %s)", secret, ex, db, app)
	}

	// An app that is not linked, told the address: no answer without the
	// password. Whether it opens a TCP connection at all is the CNI's to say.
	s := newRepo(t, "hello-shell", stranger)
	s.commit(t, "notes on Redis", map[string]string{"Dockerfile": redisNotesDockerfile(image), "notes.sh": redisNotesScript})
	mustPush(t, s)
	bexOK(t, "config:set", stranger, "MARK=guess", "REDIS_URL=redis://"+host+":6379")
	var guess string
	testenv.Eventually(t, 3*time.Minute, "the stranger answers with its config", func() error {
		body, err := curl(stranger, "/cgi-bin/notes?write=evil")
		if err == nil && !strings.HasPrefix(body, "[guess] ") {
			err = fmt.Errorf("body %q", body)
		}
		guess = body
		return err
	})
	connected := strings.Contains(guess, "NOAUTH")
	if strings.Contains(guess, "wrote") || !(connected || strings.Contains(guess, "Could not connect")) {
		t.Fatalf("an app that is not linked, without the password: %q, want NOAUTH or no connection", guess)
	}
	// The same with the password (as if it had leaked): only the
	// NetworkPolicy stands in the way, where the CNI enforces it.
	raw, err := base64.StdEncoding.DecodeString(kubectl(t, "-n", "default", "get", "secret", secret, "-o", "jsonpath={.data.password}"))
	if err != nil || len(raw) == 0 {
		t.Fatalf("the password of %s: %v", secret, err)
	}
	pw := string(raw)
	bexOK(t, "config:set", stranger, "MARK=leaked", "REDIS_URL=redis://default:"+pw+"@"+host+":6379")
	var leaked string
	testenv.Eventually(t, 3*time.Minute, "the stranger answers with its new config", func() error {
		body, err := curl(stranger, "/cgi-bin/notes")
		if err == nil && !strings.HasPrefix(body, "[leaked] ") {
			err = fmt.Errorf("body %q", body)
		}
		leaked = body
		return err
	})
	t.Logf("an app that is not linked, without the password: %q (TCP connection opened: %v); with it: %q "+
		"(this node's bridge CNI enforces no NetworkPolicy: docs/cluster.md)", strings.TrimSpace(guess), connected, strings.TrimSpace(leaked))
	bexOK(t, "apps:destroy", stranger, "--confirm", stranger)

	// Destroy: refused while linked, then everything goes.
	if _, stderr, err := bex("redis:destroy", db, "--confirm", db); err == nil || !strings.Contains(stderr, app) {
		t.Fatalf("destroy of a linked database: %v: %s", err, stderr)
	}
	bexOK(t, "redis:unlink", db, app)
	bexOK(t, "redis:destroy", db, "--confirm", db)
	gone := time.Now()
	testenv.Eventually(t, 3*time.Minute, "the Database and what it owns are gone", func() error {
		out, _ := kubectlRun("", "-n", "default", "get", "databases.app.bex.co/"+db, "statefulset/"+sts, "service/"+svc,
			"pvc/"+claim, "secret/"+secret, "networkpolicy/"+secret, "--ignore-not-found", "-o", "name")
		if out = strings.TrimSpace(out); out != "" {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})
	t.Logf("destroyed: the StatefulSet, its claim, the Service, the Secret and the NetworkPolicy gone in %.1f s", time.Since(gone).Seconds())
}
