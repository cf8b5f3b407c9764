package cluster

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// TestRegistryRequiresCredentials: bex's registry (infra/bex/registry.yaml)
// takes no request without credentials. From inside an app's pod (the probe, a
// hostile tenant that reaches the registry's Service and node port, the CNI
// enforcing no NetworkPolicy) listing every image, reading another app's
// manifest and layer, starting a push and deleting that app's manifest each
// get 401, with no credentials or guessed ones. The control, from the host
// through the node port with the deployer's credentials (the Secret
// install-bex.sh made): the same reads answer 200, and the other app's image
// is still there after the attempts; its pod was pulled by the node with the
// node's credentials, and no app's pod carries any of them.
func TestRegistryRequiresCredentials(t *testing.T) {
	const attacker, victim = "regprobe", "regvictim"
	for _, app := range []string{attacker, victim} {
		_, _, _ = bex("apps:destroy", app, "--confirm", app)
		t.Cleanup(func() { _, _, _ = bex("apps:destroy", app, "--confirm", app) })
	}
	// The victim: any app, its image in the registry and its pod pulled from
	// there by the node.
	v := newRepo(t, "hello-shell", victim)
	if out, err := v.push(); err != nil {
		t.Fatalf("push %s: %v\n%s", victim, err, out)
	}
	// The attacker: the probe, which holds no credentials.
	r := probeRepo(t, attacker)
	r.commit(t, "probe", map[string]string{"Dockerfile": probeDockerfile})
	if out, err := r.push(); err != nil {
		t.Fatalf("push %s: %v\n%s", attacker, err, out)
	}

	// The victim's image as its pod names it: <registry>/apps/regvictim@sha256:...
	// or :tag. The pod is Running, so the node pulled it.
	var image string
	testenv.Eventually(t, 2*time.Minute, victim+"'s pod runs", func() error {
		out := kubectl(t, "get", "pods", "-l", "app.bex.co/app="+victim, "-o", `jsonpath={range .items[?(@.status.phase=="Running")]}{.spec.containers[0].image}{"\n"}{end}`)
		image = strings.TrimSpace(strings.Split(out, "\n")[0])
		if image == "" {
			return fmt.Errorf("no running pod")
		}
		return nil
	})
	host, rest, _ := strings.Cut(image, "/")
	repoPath, ref, ok := strings.Cut(rest, "@")
	if !ok {
		i := strings.LastIndex(rest, ":")
		repoPath, ref = rest[:i], rest[i+1:]
	}
	t.Logf("%s's image: %s (registry %s, repository %s, reference %s)", victim, image, host, repoPath, ref)

	// The control's credentials and address: the deployer's user, through the
	// node port from the host.
	var secret struct{ Data map[string][]byte }
	if err := json.Unmarshal([]byte(kubectl(t, "-n", "bex-system", "get", "secret", "bex-registry-deployer", "-o", "json")), &secret); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Auths map[string]struct{ Auth string }
	}
	if err := json.Unmarshal(secret.Data["config.json"], &cfg); err != nil {
		t.Fatalf("the Secret bex-registry-deployer's config.json: %v", err)
	}
	userPass, err := base64.StdEncoding.DecodeString(cfg.Auths[host].Auth)
	user, pass, ok := strings.Cut(string(userPass), ":")
	if err != nil || !ok {
		t.Fatalf("the Secret bex-registry-deployer has no credentials for %s", host)
	}
	nodeIP := strings.TrimSpace(kubectl(t, "get", "nodes", "-o", `jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}`))
	nodePort := "http://" + nodeIP + ":30500"
	hostGet := func(t *testing.T, u, p, path string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest("GET", nodePort+path, nil)
		req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
		if u != "" {
			req.SetBasicAuth(u, p)
		}
		resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b), resp.Header
	}
	manifestPath := "/v2/" + repoPath + "/manifests/" + ref
	code, body, hdr := hostGet(t, user, pass, manifestPath)
	if code != 200 {
		t.Fatalf("control: GET %s as %s: %d %.200s", manifestPath, user, code, body)
	}
	digest := hdr.Get("Docker-Content-Digest")
	var manifest struct {
		Layers []struct{ Digest string }
	}
	if err := json.Unmarshal([]byte(body), &manifest); err != nil || len(manifest.Layers) == 0 || digest == "" {
		t.Fatalf("control: %s's manifest (digest %q): %v: %.200s", victim, digest, err, body)
	}
	layerPath := "/v2/" + repoPath + "/blobs/" + manifest.Layers[0].Digest

	t.Run("an app's pod gets 401", func(t *testing.T) {
		hc := httpsClient(t)
		probe := func(t *testing.T, method, u string) probeResult {
			t.Helper()
			var res probeResult
			testenv.Eventually(t, time.Minute, "the probe answers", func() error {
				code, b, err := get(hc, attacker, "/http?"+url.Values{"method": {method}, "url": {u}}.Encode())
				if err == nil && code != 200 {
					err = fmt.Errorf("%d %.200s", code, b)
				}
				if err == nil {
					err = json.Unmarshal([]byte(b), &res)
				}
				return err
			})
			return res
		}
		for _, base := range []string{"http://" + host, nodePort, "http://builder:guessed@" + host} {
			for _, a := range []struct{ method, path string }{
				{"GET", "/v2/_catalog"},
				{"GET", manifestPath},
				{"GET", layerPath},
				{"POST", "/v2/apps/" + attacker + "-intruder/blobs/uploads/"},
				{"DELETE", "/v2/" + repoPath + "/manifests/" + digest},
			} {
				res := probe(t, a.method, base+a.path)
				t.Logf("%s %s%s: connected=%v status=%d", a.method, base, a.path, res.Connected, res.Status)
				if !res.Connected || res.Status != http.StatusUnauthorized {
					t.Errorf("from an app's pod, %s %s%s: connected=%v status=%d err=%q body=%.120q, want 401", a.method, base, a.path, res.Connected, res.Status, res.Err, res.Body)
				}
			}
		}
	})

	t.Run("control: credentials read, the image is intact", func(t *testing.T) {
		for _, path := range []string{"/v2/_catalog", manifestPath, layerPath} {
			if code, body, _ := hostGet(t, user, pass, path); code != 200 {
				t.Errorf("GET %s as %s: %d %.200s", path, user, code, body)
			}
			if code, _, _ := hostGet(t, "", "", path); code != http.StatusUnauthorized {
				t.Errorf("GET %s without credentials from the host: %d, want 401", path, code)
			}
			if code, _, _ := hostGet(t, user, pass+"x", path); code != http.StatusUnauthorized {
				t.Errorf("GET %s with a wrong password from the host: %d, want 401", path, code)
			}
		}
		if _, err := curl(victim, "/"); err != nil {
			t.Errorf("%s no longer serves: %v", victim, err)
		}
	})

	t.Run("no app's pod carries registry credentials", func(t *testing.T) {
		var pods struct {
			Items []struct {
				Metadata struct{ Name string }
				Spec     struct {
					ImagePullSecrets []struct{ Name string } `json:"imagePullSecrets"`
					Volumes          []struct {
						Secret *struct {
							SecretName string `json:"secretName"`
						} `json:"secret"`
					} `json:"volumes"`
				}
			}
		}
		if err := json.Unmarshal([]byte(kubectl(t, "get", "pods", "-l", "app.bex.co/app", "-o", "json")), &pods); err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == 0 {
			t.Fatal("no app pods listed")
		}
		for _, p := range pods.Items {
			if len(p.Spec.ImagePullSecrets) > 0 {
				t.Errorf("pod %s has imagePullSecrets %v", p.Metadata.Name, p.Spec.ImagePullSecrets)
			}
			for _, v := range p.Spec.Volumes {
				if v.Secret != nil && strings.HasPrefix(v.Secret.SecretName, "bex-registry") {
					t.Errorf("pod %s mounts %s", p.Metadata.Name, v.Secret.SecretName)
				}
			}
		}
	})
}
