package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	out := flag.String("out", "", "directory that receives the archives and images.env (required)")
	bin := flag.String("bin", "", "directory of the tools hack/tools.sh builds (default: bin/ of the repository)")
	kube := flag.String("kube-images", "", "write only DIR/"+KubeImagesArchive+", with these images (what `kubeadm config images list` prints, separated by spaces)")
	kubeVersion := flag.String("kube-version", "", "with --kube-images: the Kubernetes release of the components (default KUBE_VERSION of hack/versions.env)")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: go run ./hack/nodeimages --out DIR [--bin BIN] [--kube-images NAMES [--kube-version VERSION]]")
		os.Exit(2)
	}
	if *kube != "" {
		root, err := repoRoot()
		if err == nil {
			var w Written
			w, err = KubeImages(Options{Root: root, Bin: *bin, Out: *out, Log: os.Stderr}, *kubeVersion, strings.Fields(*kube))
			if err == nil {
				fmt.Printf("%s %d bytes\n", w.Archive, w.Size)
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "nodeimages: %v\n", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	root, err := repoRoot()
	if err == nil {
		var imgs []Written
		imgs, err = Build(ctx, Options{Root: root, Bin: *bin, Out: *out, Log: os.Stderr})
		for _, w := range imgs {
			fmt.Printf("%s %s %d bytes\n", w.Image, w.Archive, w.Size)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nodeimages: %v\n", err)
		os.Exit(1)
	}
}

// repoRoot is the directory of bex's go.mod above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module bex.co/bex\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the bex repository (no go.mod of module bex.co/bex above the working directory)")
		}
		dir = parent
	}
}
