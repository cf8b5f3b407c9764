package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"bex.co/bex/internal/machine/imagebuild"
)

// KubeImagesArchive is the archive KubeImages writes into Out: every image that
// kubeadm runs a control plane and a node with, for a node image that pulls
// nothing (hack/capd-images.sh bakes it into the machines of Cluster API's Docker
// provider).
const KubeImagesArchive = "kube-images.tar"

// xtablesModules is where iptables (nft) finds its matches and targets, which it
// opens at run time: ldd does not list them.
const xtablesModules = "/usr/lib/x86_64-linux-gnu/xtables"

// KubeImages writes Out/kube-images.tar: one docker archive with each of names
// (what `kubeadm config images list` prints for the node's Kubernetes version),
// made of this machine's files. The control plane's components and kube-proxy
// share one layer (their binaries of BIN/kube-VERSION and BIN/kubenode-VERSION at
// /usr/local/bin, where the static pods' commands find them, with iptables for
// kube-proxy); etcd is BIN/kube-VERSION/etcd; pause is hack/nodeimages/pause; CoreDNS is
// BIN/coredns-COREDNS_VERSION (the name keeps kubeadm's tag: the overlay that
// runs it says which version it is). A kube-proxy of another release (an
// upgrade's node image carries both) is a layer of its own, from
// BIN/kubenode-ITS_TAG. It is not written again when its inputs are those of the
// archive there.
//
// version is the Kubernetes release of the components (BIN/kube-VERSION and
// BIN/kubenode-VERSION); empty, KUBE_VERSION. etcd is the one of BIN/kube-VERSION
// too: each release's own.
func KubeImages(o Options, version string, names []string) (Written, error) {
	w := Written{Key: "KUBE", Archive: filepath.Join(o.Out, KubeImagesArchive)}
	if o.Bin == "" {
		o.Bin = filepath.Join(o.Root, "bin")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	versions, err := readEnv(filepath.Join(o.Root, "hack", "versions.env"))
	if err != nil {
		return w, err
	}
	kube := versions["KUBE_VERSION"]
	if version != "" {
		kube = version
	}
	tool := func(dir, binary string) (string, error) {
		p := filepath.Join(o.Bin, dir, binary)
		if _, err := os.Stat(filepath.Join(o.Bin, dir, ".complete")); err != nil {
			return "", fmt.Errorf("%s is not built: run `make tools` (hack/tools.sh builds it)", p)
		}
		return p, nil
	}
	pause, err := buildPause(o.Root, o.Out)
	if err != nil {
		return w, err
	}
	defer os.Remove(pause)
	coredns, err := tool("coredns-"+versions["COREDNS_VERSION"], "coredns")
	if err != nil {
		return w, err
	}

	components := map[string]string{}
	for _, b := range []struct{ dir, name string }{
		{"kube-" + kube, "kube-apiserver"}, {"kube-" + kube, "etcd"},
		{"kubenode-" + kube, "kube-controller-manager"}, {"kubenode-" + kube, "kube-scheduler"}, {"kubenode-" + kube, "kube-proxy"},
	} {
		p, err := tool(b.dir, b.name)
		if err != nil {
			return w, err
		}
		components["/usr/local/bin/"+b.name] = p
	}
	// kube-proxy's iptables: the nft variant, one program that acts by the name it
	// is called with, and its modules.
	iptables := map[string]string{}
	for _, n := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		iptables["/usr/sbin/"+n] = "/usr/sbin/" + n
	}
	mods, err := filepath.Glob(filepath.Join(xtablesModules, "*.so"))
	if err != nil || len(mods) == 0 {
		return w, fmt.Errorf("no iptables modules in %s (apt-get install iptables)", xtablesModules)
	}
	for _, m := range mods {
		iptables[m] = m
		// Not executables: HostLayer does not look for their libraries.
		libs, err := imagebuild.Libraries(m)
		if err != nil {
			return w, fmt.Errorf("%s: %w", m, err)
		}
		for _, l := range libs {
			iptables[l] = l
		}
	}
	maps.Copy(components, iptables)

	type image struct {
		layer      func() ([]byte, error)
		entrypoint []string
	}
	byKind := map[string]image{
		"component": {layer: func() ([]byte, error) { return imagebuild.HostLayer(components) }},
		"pause":     {layer: func() ([]byte, error) { return imagebuild.HostLayer(map[string]string{"/pause": pause}) }, entrypoint: []string{"/pause"}},
		"coredns": {layer: func() ([]byte, error) {
			return imagebuild.HostLayer(map[string]string{"/coredns": coredns, caCerts: caCerts})
		}, entrypoint: []string{"/coredns"}},
	}
	kindOf := func(ref string) (string, error) {
		repo, tag := ref, ""
		if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
			repo, tag = ref[:i], ref[i+1:]
		}
		switch path.Base(repo) {
		case "kube-proxy":
			if tag == kube || tag == "" {
				return "component", nil
			}
			// Another release's kube-proxy (an upgrade's: a DaemonSet runs the
			// control plane's on every node, whatever the node's release): a
			// layer of its own, its binary of BIN/kubenode-TAG and iptables.
			k := "kube-proxy-" + tag
			if _, ok := byKind[k]; !ok {
				p, err := tool("kubenode-"+tag, "kube-proxy")
				if err != nil {
					return "", fmt.Errorf("%s: %w", ref, err)
				}
				files := maps.Clone(iptables)
				files["/usr/local/bin/kube-proxy"] = p
				byKind[k] = image{layer: func() ([]byte, error) { return imagebuild.HostLayer(files) }}
			}
			return k, nil
		case "kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd":
			return "component", nil
		case "pause":
			return "pause", nil
		case "coredns":
			return "coredns", nil
		}
		return "", fmt.Errorf("%s: not an image of kubeadm's that this machine can make", ref)
	}

	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	layers := map[string][]byte{}
	h := sha256.New()
	refs := map[name.Reference]v1.Image{}
	images := map[string]v1.Image{}
	for _, n := range sorted {
		k, err := kindOf(n)
		if err != nil {
			return w, err
		}
		tag, err := name.NewTag(n, name.StrictValidation)
		if err != nil {
			return w, err
		}
		if images[k] == nil {
			start := time.Now()
			layer, err := byKind[k].layer()
			if err != nil {
				return w, fmt.Errorf("%s: %w", n, err)
			}
			layers[k] = layer
			img, err := layerImage(layer, byKind[k].entrypoint, nil)
			if err != nil {
				return w, err
			}
			images[k] = img
			fmt.Fprintf(o.Log, "kube images: the %s layer (%d bytes) in %v\n", k, len(layer), time.Since(start).Round(time.Millisecond))
		}
		settings, _ := json.Marshal([]any{n, k, byKind[k].entrypoint})
		h.Write(settings)
		h.Write(layers[k])
		refs[tag] = images[k]
	}
	inputs := hex.EncodeToString(h.Sum(nil))
	if w, done := upToDate(w, inputs); done {
		return w, nil
	}
	return writeArchive(w, inputs, func(f io.Writer) error { return tarball.MultiRefWrite(refs, f) })
}
