package clusterapi

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"bex.co/bex/internal/freeport"
	"bex.co/bex/internal/ready"
)

// Module names the part of the release a manager's CRDs and webhooks come from.
const (
	ModuleCore = "core" // sigs.k8s.io/cluster-api
	ModuleTest = "test" // sigs.k8s.io/cluster-api/test (CAPD)
)

// Manager is one Cluster API controller manager: its binary in bin/, the part of
// the release its CRDs and webhooks come from, and its ports on loopback.
type Manager struct {
	Name   string // bin/<Name>
	Module string // ModuleCore or ModuleTest
	Dir    string // directory within the module with config/crd and config/webhook

	WebhookPort     int // its webhooks (admission and conversion), TLS
	HealthPort      int // /readyz and /healthz
	DiagnosticsPort int // metrics
}

// Managers returns the four managers of a management plane, with fixed ports: for
// a network namespace of one's own, where nothing else can hold them. On the host,
// give them free ones with WithFreePorts.
func Managers() []Manager {
	return []Manager{
		{Name: "cluster-api-controller", Module: ModuleCore, Dir: "core", WebhookPort: 9441, HealthPort: 9451, DiagnosticsPort: 8441},
		{Name: "kubeadm-bootstrap-controller", Module: ModuleCore, Dir: "bootstrap/kubeadm", WebhookPort: 9442, HealthPort: 9452, DiagnosticsPort: 8442},
		{Name: "kubeadm-control-plane-controller", Module: ModuleCore, Dir: "controlplane/kubeadm", WebhookPort: 9443, HealthPort: 9453, DiagnosticsPort: 8443},
		// CAPD: since v1.13 the in-memory provider is CAPD's DevCluster/DevMachine
		// with the inMemory backend, in CAPD's manager; its Docker backend is
		// DockerCluster/DockerMachine, in the same manager.
		{Name: "capd-manager", Module: ModuleTest, Dir: "infrastructure/docker", WebhookPort: 9444, HealthPort: 9454, DiagnosticsPort: 8444},
	}
}

// WithFreePorts returns a copy of ms whose ports are free on 127.0.0.1 (a moment
// ago) and distinct from each other.
func WithFreePorts(ms []Manager) ([]Manager, error) {
	taken := map[int]bool{}
	pick := func() (int, error) {
		for range 20 {
			p, err := freeport.Loopback()
			if err != nil {
				return 0, err
			}
			if !taken[p] {
				taken[p] = true
				return p, nil
			}
		}
		return 0, fmt.Errorf("no distinct free port on 127.0.0.1 after 20 tries")
	}
	out := make([]Manager, len(ms))
	for i, m := range ms {
		for _, p := range []*int{&m.WebhookPort, &m.HealthPort, &m.DiagnosticsPort} {
			var err error
			if *p, err = pick(); err != nil {
				return nil, err
			}
		}
		out[i] = m
	}
	return out, nil
}

// Args are m's flags: against the API server of kubeconfig, its webhooks served
// with the certificate in certDir, without leader election (one replica).
func (m Manager) Args(kubeconfig, certDir string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		fmt.Sprintf("--webhook-port=%d", m.WebhookPort),
		"--webhook-cert-dir=" + certDir,
		fmt.Sprintf("--health-addr=127.0.0.1:%d", m.HealthPort),
		fmt.Sprintf("--diagnostics-address=127.0.0.1:%d", m.DiagnosticsPort),
		"--insecure-diagnostics",
		"--leader-elect=false",
		"--v=2",
	}
}

// WebhookURL is the URL of m's webhook at path.
func (m Manager) WebhookURL(path string) string {
	return fmt.Sprintf("https://127.0.0.1:%d%s", m.WebhookPort, path)
}

// ReadyzURL is m's readiness endpoint; it answers 200 once m's caches are synced
// and its webhook server serves.
func (m Manager) ReadyzURL() string { return fmt.Sprintf("http://127.0.0.1:%d/readyz", m.HealthPort) }

var readyzClient = &http.Client{Timeout: 2 * time.Second}

// Ready is the readiness check of m: its /readyz answers 200.
func (m Manager) Ready(ctx context.Context) error { return ready.Get(ctx, readyzClient, m.ReadyzURL()) }
