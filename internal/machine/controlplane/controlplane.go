package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"bex.co/bex/internal/machine/supervise"
	"bex.co/bex/internal/pki"
	"bex.co/bex/internal/ready"

	"bex.co/bex/internal/freeport"
)

// ServiceCIDR is the range Services get their (unused, on one machine) cluster IPs
// from; large enough for a Service per app by the thousand.
const ServiceCIDR = "10.96.0.0/16"

// Config says where the control plane keeps its data and finds its programs.
type Config struct {
	// Dir holds the PKI, etcd's data, the ports and the logs.
	Dir string
	// Etcd and APIServer are the paths of the etcd and kube-apiserver binaries.
	Etcd, APIServer string
	// QuotaBackendBytes is etcd's space quota (--quota-backend-bytes); 0 is
	// QuotaFor(Dir), measured at Prepare.
	QuotaBackendBytes int64
	// Log receives what the control plane does on its own (recovering etcd from a
	// NOSPACE alarm); nil is slog.Default().
	Log *slog.Logger
	// AlarmInterval is how often WatchSpace asks etcd for its alarms; 0 is 30s.
	AlarmInterval time.Duration
}

// DefaultConfig returns the defaults; Dir and the binaries' paths, which have
// none, are empty. A zero field also means its default.
func DefaultConfig() Config { return Config{AlarmInterval: 30 * time.Second} }

// ControlPlane is a prepared control plane: its PKI and ports exist; Processes
// says how to run it.
type ControlPlane struct {
	cfg   Config
	pki   pkiDir
	ports ports
	quota int64 // etcd's --quota-backend-bytes
}

func (cp *ControlPlane) log() *slog.Logger {
	if cp.cfg.Log != nil {
		return cp.cfg.Log
	}
	return slog.Default()
}

// ports are the loopback ports, chosen free on the first start and kept, because
// the kubeconfig names the API server's.
type ports struct {
	EtcdClient int `json:"etcdClient"`
	// EtcdPeer was etcd's peer port before etcd's peer listener moved to a socket
	// (peerURL); kept when a ports.json has it, never used.
	EtcdPeer  int `json:"etcdPeer,omitempty"`
	APIServer int `json:"apiServer"`
}

// Prepare makes whatever is missing under cfg.Dir (keys, certificates, ports, the
// peer socket's directory) and checks that the kept ports are free. A directory
// made by an older bex gets what is missing and keeps its data.
func Prepare(cfg Config) (*ControlPlane, error) {
	cp := &ControlPlane{cfg: cfg, pki: pkiDir{dir: filepath.Join(cfg.Dir, "pki")}}
	if err := cp.pki.ensure(); err != nil {
		return nil, fmt.Errorf("control plane keys in %s: %w", cp.pki.dir, err)
	}
	if err := os.MkdirAll(cp.runDir(), 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(cp.runDir(), 0o700); err != nil {
		return nil, err
	}
	if err := cp.loadPorts(); err != nil {
		return nil, err
	}
	if cp.quota = cfg.QuotaBackendBytes; cp.quota <= 0 {
		cp.quota = QuotaFor(cfg.Dir)
	}
	for name, port := range map[string]int{"etcd": cp.ports.EtcdClient, "kube-apiserver": cp.ports.APIServer} {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return nil, fmt.Errorf("%s port 127.0.0.1:%d (kept in %s) is taken: is another bex up running on this state dir? (%v)", name, port, cp.portsPath(), err)
		}
		l.Close()
	}
	return cp, nil
}

func (cp *ControlPlane) portsPath() string { return filepath.Join(cp.cfg.Dir, "ports.json") }

// runDir holds etcd's peer socket: 0700, so that only root reaches it.
func (cp *ControlPlane) runDir() string { return filepath.Join(cp.cfg.Dir, "run") }

func (cp *ControlPlane) loadPorts() error {
	data, err := os.ReadFile(cp.portsPath())
	if err == nil {
		if err := json.Unmarshal(data, &cp.ports); err != nil {
			return fmt.Errorf("%s: %w (remove it to choose new ports)", cp.portsPath(), err)
		}
		return nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, p := range []*int{&cp.ports.EtcdClient, &cp.ports.APIServer} {
		if *p, err = freeport.Loopback(); err != nil {
			return err
		}
	}
	data, _ = json.Marshal(cp.ports)
	return pki.WriteFile(cp.portsPath(), data, 0o600)
}

// Host is the API server's URL.
func (cp *ControlPlane) Host() string { return fmt.Sprintf("https://127.0.0.1:%d", cp.ports.APIServer) }

// EtcdURL is etcd's client URL: HTTPS on loopback, and only clients with a
// certificate from etcd's own CA get an answer (--client-cert-auth).
func (cp *ControlPlane) EtcdURL() string {
	return fmt.Sprintf("https://127.0.0.1:%d", cp.ports.EtcdClient)
}

// peerURL is etcd's peer listener: a unix socket in runDir, relative to etcd's
// working directory because etcd takes a unix URL's host as the socket's path.
// A single member has no peer to talk to, but etcd always opens the listener;
// a socket in a 0700 directory is one nobody else reaches, where a TCP port on
// loopback would answer every local process and every container on the host's
// network.
const peerURL = "unix://peer.sock"

// Etcd is the etcd process.
func (cp *ControlPlane) Etcd() supervise.Process {
	return supervise.Process{
		Name: "etcd",
		Path: cp.cfg.Etcd,
		Dir:  cp.runDir(),
		Args: []string{
			"--name", "bex",
			"--data-dir", filepath.Join(cp.cfg.Dir, "etcd"),
			"--listen-client-urls", cp.EtcdURL(),
			"--advertise-client-urls", cp.EtcdURL(),
			"--client-cert-auth",
			"--trusted-ca-file", cp.pki.path(etcdCACert),
			"--cert-file", cp.pki.path(etcdServerCert),
			"--key-file", cp.pki.path(etcdServerKey),
			"--listen-peer-urls", peerURL,
			// Read on the first start only; a data dir made by an older bex keeps the
			// member's old peer URL, which no one dials on one machine.
			"--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", "bex=" + peerURL,
			"--log-level", "warn",
			// Fewer raft entries held in memory between snapshots (defaults 10000 and
			// 5000): one member has no follower to catch up, and the App API writes
			// little, so the log kept in memory is waste (issue 18, idle memory).
			"--snapshot-count", "2000",
			"--snapshot-catchup-entries", "500",
			// An explicit space quota (QuotaFor): etcd's database reaching it is a
			// NOSPACE alarm, a read-only API that recoverSpace undoes, where the disk
			// filling under etcd would end it.
			"--quota-backend-bytes", strconv.FormatInt(cp.quota, 10),
		},
		LogPath: filepath.Join(cp.cfg.Dir, "etcd.log"),
		Ready: func(ctx context.Context) error {
			hc, err := cp.EtcdClient()
			if err != nil {
				return err
			}
			// /health is false while an alarm is raised, and a NOSPACE alarm is kept
			// in the data dir across restarts: etcd serves (reads, deletes) with it,
			// and it is handled below rather than left to block every start.
			if err := ready.Get(ctx, hc, cp.EtcdURL()+"/health?exclude=NOSPACE"); err != nil {
				return err
			}
			if err := cp.updatePeerURL(ctx, hc); err != nil {
				return err
			}
			if err := cp.recoverSpace(ctx, hc); err != nil {
				cp.log().Warn("cannot check etcd for a NOSPACE alarm or handle one; WatchSpace tries again", "err", err)
			}
			return nil
		},
		// etcd fsyncs its WAL on shutdown; give it time rather than corrupt it.
		Grace: 20 * time.Second,
	}
}

// updatePeerURL makes the member's peer URL the socket's when a data dir made by
// an older bex still names its TCP peer port (etcd reads --initial-advertise-peer-urls
// on the first start only), so that the member list says what etcd listens on.
// It goes through etcd's JSON gateway, to need no etcd client library.
func (cp *ControlPlane) updatePeerURL(ctx context.Context, hc *http.Client) error {
	var list struct {
		Members []struct {
			ID       string   `json:"ID"`
			PeerURLs []string `json:"peerURLs"`
		} `json:"members"`
	}
	if err := postJSON(ctx, hc, cp.EtcdURL()+"/v3/cluster/member/list", struct{}{}, &list); err != nil {
		return err
	}
	for _, m := range list.Members {
		if len(m.PeerURLs) == 1 && m.PeerURLs[0] == peerURL {
			continue
		}
		update := map[string]any{"ID": m.ID, "peerURLs": []string{peerURL}}
		if err := postJSON(ctx, hc, cp.EtcdURL()+"/v3/cluster/member/update", update, nil); err != nil {
			return fmt.Errorf("etcd member %s: peer URLs %v to %s: %w", m.ID, m.PeerURLs, peerURL, err)
		}
	}
	return nil
}

func postJSON(ctx context.Context, hc *http.Client, url string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, data)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// EtcdClient is an HTTP client that etcd answers: the API server's client
// certificate, and etcd's CA.
func (cp *ControlPlane) EtcdClient() (*http.Client, error) {
	cfg := &rest.Config{TLSClientConfig: rest.TLSClientConfig{
		CAFile:   cp.pki.path(etcdCACert),
		CertFile: cp.pki.path(etcdClientCert),
		KeyFile:  cp.pki.path(etcdClientKey),
	}}
	return rest.HTTPClientFor(cfg)
}

// EtcdCAFile is the certificate of etcd's CA, for clients that check etcd.
func (cp *ControlPlane) EtcdCAFile() string { return cp.pki.path(etcdCACert) }

// CAFile is the certificate of the API's CA.
func (cp *ControlPlane) CAFile() string { return cp.pki.path(caCert) }

// APIServer is the kube-apiserver process.
func (cp *ControlPlane) APIServer() supervise.Process {
	return supervise.Process{
		Name: "kube-apiserver",
		Path: cp.cfg.APIServer,
		Args: []string{
			"--etcd-servers", cp.EtcdURL(),
			"--etcd-cafile", cp.pki.path(etcdCACert),
			"--etcd-certfile", cp.pki.path(etcdClientCert),
			"--etcd-keyfile", cp.pki.path(etcdClientKey),
			// The API server compacts etcd's history (its default, said here
			// because etcd's space quota counts on it): etcd runs no compactor of
			// its own.
			"--etcd-compaction-interval", "5m",
			"--bind-address", "127.0.0.1",
			"--advertise-address", "127.0.0.1",
			"--secure-port", strconv.Itoa(cp.ports.APIServer),
			"--cert-dir", filepath.Join(cp.cfg.Dir, "apiserver"),
			"--tls-cert-file", cp.pki.path(servingCert),
			"--tls-private-key-file", cp.pki.path(servingKey),
			"--client-ca-file", cp.pki.path(caCert),
			// Every client has a certificate (the kubeconfig's) or a token; the
			// readiness check below uses the admin's.
			"--anonymous-auth=false",
			"--service-account-issuer", "https://kubernetes.default.svc",
			"--service-account-key-file", cp.pki.path(serviceAcctKy),
			"--service-account-signing-key-file", cp.pki.path(serviceAcctKy),
			"--service-cluster-ip-range", ServiceCIDR,
			"--authorization-mode", "RBAC",
			"--profiling=false",
			// The "kubernetes" Service's endpoints would point at a loopback address,
			// which the API server refuses; nothing on one machine uses them.
			"--endpoint-reconciler-type", "none",
			// Memory (issue 18): the watch cache keeps a copy of every object of every
			// built-in kind, and of each CRD's, with a history of changes; bex's few
			// clients list and watch a handful of objects, which etcd serves as well.
			"--watch-cache=false",
			// API priority and fairness runs its own controllers and caches to share
			// the server among many tenants' clients; here the only clients are bex's
			// components, and the plain in-flight limits bound them.
			"--enable-priority-and-fairness=false",
			// Built-in APIs nothing here uses are not served: each costs the server its
			// REST storage (an etcd client and watches), its OpenAPI v2 and v3 schemas
			// and its discovery (issue 18, idle memory: 92 MiB anonymous with every
			// group but batch, autoscaling, policy, certificates, events and
			// flowcontrol, 79 with these; BenchmarkIdleMemory). What stays: core, RBAC
			// (the authorizer), authentication and authorization (token and access
			// reviews), coordination (leases), apiextensions (bex's CRDs),
			// apiregistration (the aggregator in front of it all), discovery (the
			// EndpointSlices the local runtime publishes and the edge routes by),
			// networking (the server's own service-IP allocator keeps its IPAddresses
			// there) and admissionregistration (the server's informers of it must
			// sync before it says it is ready, even with the webhook plugins off).
			// apps is not served: only the deployer's Kubernetes runtime uses it, on a
			// cluster.
			"--runtime-config", "api/all=false,api/v1=true," +
				"rbac.authorization.k8s.io/v1=true,authentication.k8s.io/v1=true,authorization.k8s.io/v1=true," +
				"coordination.k8s.io/v1=true,apiextensions.k8s.io/v1=true,apiregistration.k8s.io/v1=true," +
				"discovery.k8s.io/v1=true,networking.k8s.io/v1=true,admissionregistration.k8s.io/v1=true",
			// No token controller runs here to make service-account tokens
			// (ServiceAccount); the other plugins are those of APIs that are not served
			// (Priority: scheduling; RuntimeClass: node; the storage class and volume
			// plugins: storage; the webhooks and admission policies: their
			// configurations are never made here, and the policies' CEL environments
			// alone take megabytes).
			"--disable-admission-plugins", "ServiceAccount,Priority,RuntimeClass," +
				"DefaultStorageClass,StorageObjectInUseProtection,PersistentVolumeClaimResize," +
				"MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy",
		},
		LogPath:      filepath.Join(cp.cfg.Dir, "kube-apiserver.log"),
		ReadyTimeout: 2 * time.Minute,
		Ready: func(ctx context.Context) error {
			hc, err := cp.httpClient()
			if err != nil {
				return err
			}
			return ready.Get(ctx, hc, cp.Host()+"/readyz")
		},
	}
}

func (cp *ControlPlane) httpClient() (*http.Client, error) {
	cfg, err := cp.RESTConfig()
	if err != nil {
		return nil, err
	}
	return rest.HTTPClientFor(cfg)
}

// RESTConfig reaches the API server as the admin.
func (cp *ControlPlane) RESTConfig() (*rest.Config, error) {
	return &rest.Config{
		Host: cp.Host(),
		TLSClientConfig: rest.TLSClientConfig{
			CAFile:   cp.pki.path(caCert),
			CertFile: cp.pki.path(adminCert),
			KeyFile:  cp.pki.path(adminKey),
		},
		QPS: 50, Burst: 100,
	}, nil
}

// WriteKubeconfig writes a kubeconfig for the admin to path, certificates inline, so
// that it works when copied elsewhere on the machine.
func (cp *ControlPlane) WriteKubeconfig(path string) error {
	read := func(name string) ([]byte, error) { return os.ReadFile(cp.pki.path(name)) }
	ca, err := read(caCert)
	if err != nil {
		return err
	}
	cert, err := read(adminCert)
	if err != nil {
		return err
	}
	key, err := read(adminKey)
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["bex"] = &clientcmdapi.Cluster{Server: cp.Host(), CertificateAuthorityData: ca}
	kc.AuthInfos["bex-admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	kc.Contexts["bex"] = &clientcmdapi.Context{Cluster: "bex", AuthInfo: "bex-admin", Namespace: "default"}
	kc.CurrentContext = "bex"
	data, err := clientcmd.Write(*kc)
	if err != nil {
		return err
	}
	return pki.WriteFile(path, data, 0o600)
}
