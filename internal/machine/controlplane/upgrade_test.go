package controlplane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/deployer/api/crds"
	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/machine/controlplane"
	"bex.co/bex/internal/machine/supervise"
	"bex.co/bex/internal/testenv"
)

// oldLayout turns a prepared directory into what an older bex left: no etcd
// certificates, a ports.json with a peer port, etcd on plain HTTP with a TCP peer
// listener. It starts that etcd and an API server on it, as the older bex did,
// and returns them running.
func oldLayout(t *testing.T, cfg controlplane.Config, cp *controlplane.ControlPlane) (*supervise.Supervisor, int) {
	t.Helper()
	for _, f := range []string{"etcd", "apiserver-etcd-client.crt", "apiserver-etcd-client.key"} {
		if err := os.RemoveAll(filepath.Join(cfg.Dir, "pki", f)); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(filepath.Join(cfg.Dir, "ports.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ports map[string]int
	if err := json.Unmarshal(data, &ports); err != nil {
		t.Fatal(err)
	}
	peer, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ports["etcdPeer"] = peer
	data, _ = json.Marshal(ports)
	if err := os.WriteFile(filepath.Join(cfg.Dir, "ports.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", ports["etcdClient"])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	etcd := supervise.Process{Name: "old-etcd", Path: cfg.Etcd, LogPath: filepath.Join(cfg.Dir, "old-etcd.log"),
		Args: []string{"--name", "bex", "--data-dir", filepath.Join(cfg.Dir, "etcd"),
			"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL, "--initial-cluster", "bex=" + peerURL},
		Ready: func(ctx context.Context) error {
			conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", strings.TrimPrefix(clientURL, "http://"))
			if err == nil {
				conn.Close()
			}
			return err
		},
	}
	// The API server as the older bex ran it: the same flags but etcd's, and
	// anonymous requests allowed.
	api := cp.APIServer()
	var args []string
	for i := 0; i < len(api.Args); i++ {
		switch a := api.Args[i]; a {
		case "--etcd-servers":
			args = append(args, a, clientURL)
			i++
		case "--etcd-cafile", "--etcd-certfile", "--etcd-keyfile":
			i++
		case "--anonymous-auth=false":
		default:
			args = append(args, a)
		}
	}
	api.Args = args
	sup := supervise.New(nil)
	for _, p := range []supervise.Process{etcd, api} {
		if _, err := sup.Start(context.Background(), p); err != nil {
			sup.Stop()
			t.Fatal(err)
		}
	}
	return sup, peer
}

// A state dir made by an older bex (etcd on plain HTTP with a TCP peer port, no
// etcd certificates) keeps its objects and its kubeconfig after the upgrade;
// etcd then refuses clients without a certificate, and the peer port is no
// longer open.
func TestUpgradeKeepsAnOlderStateDir(t *testing.T) {
	cfg := binaries(t)
	prepared, err := controlplane.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := prepared.WriteKubeconfig(filepath.Join(cfg.Dir, "kubeconfig")); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(cfg.Dir, "kubeconfig"))
	old, peer := oldLayout(t, cfg, prepared)
	rc, err := prepared.RESTConfig()
	if err != nil {
		old.Stop()
		t.Fatal(err)
	}
	c := newClient(t, rc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := crds.Install(ctx, c); err != nil {
		old.Stop()
		t.Fatal(err)
	}
	if err := crds.WaitServed(ctx, rc); err != nil {
		old.Stop()
		t.Fatal(err)
	}
	c = newClient(t, rc)
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "from-before", Namespace: "default"}}
	if err := c.Create(ctx, app); err != nil {
		old.Stop()
		t.Fatal(err)
	}
	if err := old.Stop(); err != nil {
		t.Fatal(err)
	}

	sup, c, cp := startCP(t, cfg)
	defer sup.Stop()
	if err := c.Get(ctx, client.ObjectKeyFromObject(app), &appv1.App{}); err != nil {
		t.Fatalf("the App did not survive the upgrade: %v", err)
	}
	after, _ := os.ReadFile(filepath.Join(cfg.Dir, "kubeconfig"))
	if !bytes.Equal(before, after) {
		t.Error("the kubeconfig changed across the upgrade")
	}
	for _, f := range []string{"etcd/ca.crt", "etcd/server.crt", "apiserver-etcd-client.crt"} {
		if _, err := os.Stat(filepath.Join(cfg.Dir, "pki", f)); err != nil {
			t.Errorf("after the upgrade: %v", err)
		}
	}
	if conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(peer))); err == nil {
		conn.Close()
		t.Errorf("the old peer port %d still accepts connections", peer)
	}
	hc, err := cp.EtcdClient()
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, cp.EtcdURL()+"/v3/cluster/member/list", strings.NewReader("{}"))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"peerURLs":["unix://peer.sock"]`) {
		t.Errorf("the member's peer URLs were not moved to the socket: %s", body)
	}
	// etcd answers no client without a certificate from its CA.
	plain, err := http.Get(strings.Replace(cp.EtcdURL(), "https://", "http://", 1) + "/v3/kv/range")
	if err == nil {
		b, _ := io.ReadAll(plain.Body)
		plain.Body.Close()
		if plain.StatusCode == http.StatusOK {
			t.Errorf("etcd answered plain HTTP: %s", b)
		}
	}
}
