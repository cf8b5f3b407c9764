package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"bex.co/bex/internal/machine/supervise"
	"bex.co/bex/internal/ready"
)

// runNode is `clusterlocal node DIR`: the node's supervisor. up starts it inside the
// node's network namespace and a mount namespace of its own; it starts the daemons
// in order, each waited for, and on SIGTERM stops them, removing the pods'
// containers before containerd stops.
func runNode(l *layout, bin string) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := l.joinNodeCgroup(); err != nil {
		return err
	}
	// A /run of its own: containerd 1.6 keeps runc's state and its FIFOs under
	// /run/containerd whatever its state setting says, and makes the pods' network
	// namespaces under /run/netns; here they stay in this mount namespace and end
	// with it, rather than on the host's /run. Mounts made below stay here too (the
	// namespace's propagation is private: unshare --propagation private).
	if err := syscall.Mount("tmpfs", "/run", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount a private /run: %w", err)
	}
	for _, d := range []string{l.path("logs"), l.path("etcd"), l.path("kubelet"), l.path("pod-logs"), l.path("cni", "ipam")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := l.mountAppVolumes(); err != nil {
		return fmt.Errorf("the apps' volumes: %w", err)
	}
	defer func() { _ = l.unmountAppVolumes() }()
	if err := os.WriteFile(l.nodePIDFile(), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	sup := supervise.New(log)
	defer func() {
		if err := sup.Stop(); err != nil {
			log.Warn("stopping the node", "err", err)
		}
		_ = os.Remove(l.nodePIDFile())
		log.Info("node stopped")
	}()
	for _, p := range l.processes(bin) {
		if _, err := sup.Start(ctx, p); err != nil {
			return fmt.Errorf("start %s: %w", p.Name, err)
		}
	}
	if err := os.WriteFile(l.path("node.ready"), nil, 0o644); err != nil {
		return err
	}
	log.Info("node ready", "api", l.apiURL())
	<-ctx.Done()
	_ = os.Remove(l.path("node.ready"))
	log.Info("stopping the node")
	return nil
}

// processes are the node's daemons in the order they start.
func (l *layout) processes(bin string) []supervise.Process {
	b := func(name string) string { return filepath.Join(bin, name) }
	return []supervise.Process{
		{
			Name: "etcd",
			Path: b("etcd"),
			Dir:  l.path("etcd"),
			Args: []string{
				"--name", nodeName,
				"--data-dir", l.path("etcd", "data"),
				"--listen-client-urls", "https://127.0.0.1:2379",
				"--advertise-client-urls", "https://127.0.0.1:2379",
				"--client-cert-auth",
				"--trusted-ca-file", l.pki("etcd-ca.crt"),
				"--cert-file", l.pki("etcd-server.crt"),
				"--key-file", l.pki("etcd-server.key"),
				// A unix socket in a 0700 directory (relative to etcd's working
				// directory): a single member has no peer, but etcd always listens.
				"--listen-peer-urls", "unix://peer.sock",
				"--initial-advertise-peer-urls", "unix://peer.sock",
				"--initial-cluster", nodeName + "=unix://peer.sock",
				"--log-level", "warn",
			},
			LogPath: l.logFile("etcd"),
			Ready:   l.httpsReady("https://127.0.0.1:2379/health", "etcd-ca.crt", "apiserver-etcd-client"),
			Grace:   20 * time.Second,
		},
		{
			Name: "kube-apiserver",
			Path: b("kube-apiserver"),
			Args: []string{
				"--etcd-servers", "https://127.0.0.1:2379",
				"--etcd-cafile", l.pki("etcd-ca.crt"),
				"--etcd-certfile", l.pki("apiserver-etcd-client.crt"),
				"--etcd-keyfile", l.pki("apiserver-etcd-client.key"),
				"--bind-address", l.nodeIP.String(),
				"--advertise-address", l.nodeIP.String(),
				"--secure-port", strconv.Itoa(apiPort),
				"--cert-dir", l.path("apiserver"),
				"--tls-cert-file", l.pki("apiserver.crt"),
				"--tls-private-key-file", l.pki("apiserver.key"),
				"--client-ca-file", l.pki("ca.crt"),
				"--anonymous-auth=false",
				"--service-account-issuer", "https://kubernetes.default.svc." + clusterDomain,
				"--service-account-key-file", l.pki("sa.pub"),
				"--service-account-signing-key-file", l.pki("sa.key"),
				"--service-cluster-ip-range", serviceCIDR,
				"--authorization-mode", "Node,RBAC",
				"--enable-admission-plugins", "NodeRestriction",
				// buildkitd runs privileged (infra/bex/buildkitd.yaml).
				"--allow-privileged",
				// logs, exec and port-forward go to the kubelet at its address; the
				// node's name resolves nowhere.
				"--kubelet-preferred-address-types", "InternalIP",
				"--kubelet-client-certificate", l.pki("apiserver-kubelet-client.crt"),
				"--kubelet-client-key", l.pki("apiserver-kubelet-client.key"),
				"--kubelet-certificate-authority", l.pki("ca.crt"),
				"--profiling=false",
			},
			LogPath:      l.logFile("kube-apiserver"),
			ReadyTimeout: 2 * time.Minute,
			Ready:        l.httpsReady(l.apiURL()+"/readyz", "ca.crt", "admin"),
		},
		{
			Name: "kube-controller-manager",
			Path: b("kube-controller-manager"),
			Args: []string{
				"--kubeconfig", l.componentKubeconfig("controller-manager"),
				"--authentication-kubeconfig", l.componentKubeconfig("controller-manager"),
				"--authorization-kubeconfig", l.componentKubeconfig("controller-manager"),
				"--service-account-private-key-file", l.pki("sa.key"),
				"--root-ca-file", l.pki("ca.crt"),
				"--cluster-signing-cert-file", l.pki("ca.crt"),
				"--cluster-signing-key-file", l.pki("ca.key"),
				"--use-service-account-credentials",
				"--service-cluster-ip-range", serviceCIDR,
				"--leader-elect=false",
				"--bind-address", "127.0.0.1",
				"--secure-port", "10257",
				"--profiling=false",
			},
			LogPath: l.logFile("kube-controller-manager"),
			Ready:   l.httpsReady("https://127.0.0.1:10257/healthz", "", ""),
		},
		{
			Name: "kube-scheduler",
			Path: b("kube-scheduler"),
			Args: []string{
				"--kubeconfig", l.componentKubeconfig("scheduler"),
				"--authentication-kubeconfig", l.componentKubeconfig("scheduler"),
				"--authorization-kubeconfig", l.componentKubeconfig("scheduler"),
				"--leader-elect=false",
				"--bind-address", "127.0.0.1",
				"--secure-port", "10259",
				"--profiling=false",
			},
			LogPath: l.logFile("kube-scheduler"),
			Ready:   l.httpsReady("https://127.0.0.1:10259/healthz", "", ""),
		},
		{
			Name:    "containerd",
			Path:    "containerd",
			Args:    []string{"--config", l.path("containerd", "config.toml")},
			LogPath: l.logFile("containerd"),
			Ready:   socketReady(l.containerdSocket()),
			// The pods' containers were removed when the kubelet stopped; what is
			// left is the daemon and its shims.
			Grace: 20 * time.Second,
		},
		{
			Name: "kubelet",
			Path: b("kubelet"),
			Args: []string{
				"--config", l.path("config", "kubelet.yaml"),
				"--kubeconfig", l.componentKubeconfig("kubelet"),
				"--root-dir", l.path("kubelet"),
				"--hostname-override", nodeName,
				"--node-ip", l.nodeIP.String(),
			},
			LogPath:   l.logFile("kubelet"),
			Ready:     httpReady("http://127.0.0.1:10248/healthz"),
			AfterStop: func() { l.removeContainers() },
		},
		{
			Name:    "kube-proxy",
			Path:    b("kube-proxy"),
			Args:    []string{"--config", l.path("config", "kube-proxy.yaml")},
			LogPath: l.logFile("kube-proxy"),
			Ready:   httpReady("http://127.0.0.1:10256/livez"),
		},
	}
}

// removeContainers kills and deletes every container of the kubelet's containerd
// namespace (the pods' and their sandboxes'), so that no shim or app process is
// left when containerd stops. It runs once the kubelet has stopped, so nothing
// starts them again.
func (l *layout) removeContainers() {
	ctr := func(args ...string) []string {
		out, _ := exec.Command("ctr", append([]string{"--address", l.containerdSocket(), "--namespace", "k8s.io"}, args...)...).Output()
		return strings.Fields(string(out))
	}
	for _, id := range ctr("tasks", "ls", "--quiet") {
		ctr("tasks", "kill", "--signal", "SIGKILL", id)
	}
	for _, id := range ctr("containers", "ls", "--quiet") {
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, err := exec.Command("ctr", "--address", l.containerdSocket(), "--namespace", "k8s.io", "tasks", "delete", "--force", id).CombinedOutput()
			if err == nil || strings.Contains(string(out), "not found") || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond) // the killed task's exit is being reported
		}
		ctr("containers", "delete", id)
	}
}

// httpsReady GETs url with a client certificate of the cluster (none when cert is
// empty) and a server verified by caFile (not verified when empty: the
// components' own self-signed health endpoints on loopback).
func (l *layout) httpsReady(url, caFile, cert string) func(context.Context) error {
	return func(ctx context.Context) error {
		cfg := &tls.Config{InsecureSkipVerify: caFile == ""} //nolint:gosec // loopback health checks of self-signed servers
		if caFile != "" {
			pem, err := os.ReadFile(l.pki(caFile))
			if err != nil {
				return err
			}
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(pem)
			cfg.RootCAs = pool
		}
		if cert != "" {
			kp, err := tls.LoadX509KeyPair(l.pki(cert+".crt"), l.pki(cert+".key"))
			if err != nil {
				return err
			}
			cfg.Certificates = []tls.Certificate{kp}
		}
		return ready.Get(ctx, &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 5 * time.Second}, url)
	}
}

func httpReady(url string) func(context.Context) error {
	return func(ctx context.Context) error {
		return ready.Get(ctx, &http.Client{Timeout: 5 * time.Second}, url)
	}
}

func socketReady(path string) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			return err
		}
		return c.Close()
	}
}
