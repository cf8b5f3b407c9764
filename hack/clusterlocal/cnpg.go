package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The Postgres that CloudNativePG runs on this node (the operand of its
// Clusters). No image can be pulled here, so it is made from Debian's packages:
// bex's postgres stand-in (bookworm's PostgreSQL 15, its programs first on
// PATH: CNPG's instance manager runs initdb, pg_ctl, pg_controldata,
// pg_basebackup, pg_rewind and postgres by name), with one more layer that
// gives its postgres user the uid 26, which CNPG runs the instances as by
// default (postgresUID and postgresGID of a Cluster, 26 and 26): initdb and
// postgres refuse to run as a uid without a name. Pushed to bex's registry,
// from which the kubelet pulls it as it pulls the apps' images.
const (
	operandRepo = "cnpg/postgresql"
	operandTag  = "15"
	postgresUID = 26
)

// operandImage is the operand's name as the Clusters give it.
func operandImage() string { return registryHost + "/" + operandRepo + ":" + operandTag }

// operandFrom makes the operand image from the postgres stand-in: one more
// layer with the new /etc/passwd, and no stop signal of its own.
func operandFrom(base v1.Image) (v1.Image, error) {
	passwd, err := fileOf(base, "etc/passwd")
	if err != nil {
		return nil, err
	}
	changed, err := withUID(passwd, "postgres", postgresUID)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/passwd", Mode: 0o644, Size: int64(len(changed)), ModTime: time.Unix(0, 0)}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(changed); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	// The stand-in stops with SIGINT (the official postgres image's fast
	// shutdown); here the process is CNPG's instance manager, which runs
	// postgres and stops it as it sees fit: the default SIGTERM.
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg := cf.Config
	cfg.StopSignal = ""
	return mutate.Config(img, cfg)
}

// fileOf is the content of the regular file path (without a leading /) in img's
// file system.
func fileOf(img v1.Image, path string) ([]byte, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("the image has no /%s", path)
		}
		if err != nil {
			return nil, err
		}
		if strings.TrimPrefix(strings.TrimPrefix(h.Name, "./"), "/") == path && h.Typeflag == tar.TypeReg {
			return io.ReadAll(tr)
		}
	}
}

// withUID gives user the uid in passwd (an /etc/passwd), which no other user
// may have.
func withUID(passwd []byte, user string, uid int) ([]byte, error) {
	lines := strings.Split(string(passwd), "\n")
	found := false
	for i, line := range lines {
		f := strings.Split(line, ":")
		if len(f) < 7 {
			continue
		}
		if f[0] == user {
			f[2] = strconv.Itoa(uid)
			lines[i] = strings.Join(f, ":")
			found = true
		} else if f[2] == strconv.Itoa(uid) {
			return nil, fmt.Errorf("/etc/passwd: %s has the uid %d already", f[0], uid)
		}
	}
	if !found {
		return nil, fmt.Errorf("/etc/passwd has no user %s", user)
	}
	return []byte(strings.Join(lines, "\n")), nil
}
