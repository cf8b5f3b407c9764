package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"bex.co/bex/internal/machine/daemons"
)

// baseDomain is where the apps of the local cluster answer (<app>.baseDomain). .test
// is reserved (RFC 2606): no public DNS answers for it, so the edge's local CA
// signs, and clients reach the edge with curl --resolve or --connect-to.
const baseDomain = "apps.bex-local.test"

func up(l *layout, root, bin string) error {
	start := time.Now()
	if pid := l.nodePID(); pid != 0 {
		return fmt.Errorf("a cluster is up in %s already (node PID %d): hack/cluster-local.sh down %s first", l.dir, pid, l.dir)
	}
	for _, d := range []string{l.path("logs"), l.path("images")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	say("node %s: API %s, network namespace %s (host %s)", nodeName, l.apiURL(), l.netns(), l.hostIP)
	if err := l.writePKI(); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	v, err := daemons.CheckRunc(filepath.Join(bin, "runc"))
	if err != nil {
		return err
	}
	say("node's containers run with runc %s (%s)", v, filepath.Join(bin, "runc"))
	if err := l.writeConfigs(bin); err != nil {
		return err
	}
	if err := l.createCgroups(); err != nil {
		return err
	}
	if err := l.createNetwork(); err != nil {
		return err
	}
	images := make(chan error, 1)
	go func() { images <- l.buildImages(root) }()
	// Needed only once bex is installed (it goes to bex's registry), and the
	// longest of the builds the first time (mmdebstrap): meanwhile.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	servers := startServerBuild(ctx)
	if err := l.startNode(); err != nil {
		<-images
		return err
	}
	say("node up in %.0f s", time.Since(start).Seconds())
	if err := <-images; err != nil {
		return err
	}
	if err := l.importImages(); err != nil {
		return err
	}
	k := l.kubectl(bin)
	if err := l.installAddons(k); err != nil {
		return err
	}
	if err := l.installBex(root, k); err != nil {
		return err
	}
	if err := l.seedRegistry(context.Background(), k); err != nil {
		return err
	}
	imgs, err := servers.wait()
	if err != nil {
		return err
	}
	if err := imgs.push(context.Background(), l, k); err != nil {
		return err
	}
	if err := l.writeEnv(k); err != nil {
		return err
	}
	say("cluster up in %.0f s; settings in %s", time.Since(start).Seconds(), l.envFile())
	return nil
}

// buildImages builds bex's image from this checkout (make image) and the node's
// own (pause, CoreDNS, the registry, BuildKit: hack/nodeimages) into DIR/images.
func (l *layout) buildImages(root string) error {
	t := time.Now()
	cmd := exec.Command("make", "-s", "image", "VERSION=dev", "IMAGE_OUTPUT="+l.path("images", "bex.tar"))
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make image: %v: %s", err, out)
	}
	cmd = exec.Command("go", "run", "./hack/nodeimages", "--out", l.path("images"), "--bin", filepath.Join(root, "bin"))
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hack/nodeimages: %v: %s", err, out)
	}
	say("images built in %.0f s", time.Since(t).Seconds())
	return nil
}

// imagesEnv reads DIR/images/images.env (NAME=value lines, hack/nodeimages).
func (l *layout) imagesEnv() (map[string]string, error) {
	b, err := os.ReadFile(l.path("images", "images.env"))
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), "="); ok {
			env[k] = v
		}
	}
	return env, nil
}

// importImages loads the archives into the kubelet's containerd namespace: the
// pods' images are there before any pod asks (imagePullPolicy IfNotPresent), as a
// node image built with them would have them.
func (l *layout) importImages() error {
	env, err := l.imagesEnv()
	if err != nil {
		return err
	}
	archives := []string{l.path("images", "bex.tar")}
	for k, v := range env {
		if strings.HasSuffix(k, "_ARCHIVE") {
			archives = append(archives, v)
		}
	}
	for _, a := range archives {
		out, err := exec.Command("ctr", "--address", l.containerdSocket(), "--namespace", "k8s.io",
			"images", "import", "--no-unpack=false", a).CombinedOutput()
		if err != nil {
			return fmt.Errorf("import %s: %v: %s", a, err, out)
		}
	}
	say("%d images imported", len(archives))
	return nil
}

type kubectl func(stdin string, args ...string) (string, error)

func (l *layout) kubectl(bin string) kubectl {
	return func(stdin string, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bin, "kubectl"), append([]string{"--kubeconfig", l.kubeconfig()}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return string(out), nil
	}
}

// writeEnv writes DIR/cluster.env, the cluster's contract with scripts and tests.
func (l *layout) writeEnv(k kubectl) error {
	ca, err := k("", "-n", "bex-system", "get", "secret", "bex-edge-ca", "-o", `jsonpath={.data.ca\.pem}`)
	if err != nil {
		return err
	}
	pem, err := decodeBase64(ca)
	if err != nil {
		return fmt.Errorf("the Secret bex-system/bex-edge-ca: %w", err)
	}
	caFile := l.path("edge-ca.pem")
	if err := os.WriteFile(caFile, pem, 0o644); err != nil {
		return err
	}
	env := fmt.Sprintf(`KUBECONFIG=%s
SSH_ADDR=%s:%d
HTTPS_ADDR=%s:443
BASE_DOMAIN=%s
CA_FILE=%s
ADMIN_IDENTITY=%s
NODE_NETNS=/run/netns/%s
NODE_IP=%s
CNPG_POSTGRES_IMAGE=%s
REDIS_IMAGE=%s
`, l.kubeconfig(), l.nodeIP, sshNodePort, l.nodeIP, baseDomain, caFile, l.adminIdentity(), l.netns(), l.nodeIP, operandImage(), redisImage())
	return os.WriteFile(l.envFile(), []byte(env), 0o644)
}
