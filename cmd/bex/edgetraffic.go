package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"bex.co/bex/gitserver/backend"
)

// edgeTrafficTimeout bounds one read of the edge's figures: they are counters in
// its memory, and metrics or diagnose should rather say they cannot be read
// than wait on a stuck edge.
const edgeTrafficTimeout = 2 * time.Second

// edgeTraffic is backend.Traffic and backend.Certificates over the edge's stats
// endpoint (bex edge --stats-addr, edge.StatsHandler): the gitserver and the
// edge are separate components, joined here by HTTP on a socket only root
// reaches.
type edgeTraffic struct {
	base   string // http://HOST:PORT, or a placeholder host with a unix socket
	client *http.Client
}

// edgeTrafficFrom is the backend's Traffic for --edge-stats: nil (no figures)
// when it is empty.
func edgeTrafficFrom(addr string) (backend.Traffic, error) {
	if addr == "" {
		return nil, nil
	}
	t, err := newEdgeTraffic(addr)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// edgeCertificatesFrom is the backend's Certificates for --edge-stats: nil (no
// certificate state) when it is empty.
func edgeCertificatesFrom(addr string) (backend.Certificates, error) {
	if addr == "" {
		return nil, nil
	}
	c, err := newEdgeTraffic(addr)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// newEdgeTraffic reads the figures at addr: unix:PATH or host:port.
func newEdgeTraffic(addr string) (*edgeTraffic, error) {
	tr := &http.Transport{
		Proxy:              nil, // never an HTTP_PROXY from the environment: the edge is local
		MaxIdleConns:       2,
		IdleConnTimeout:    time.Minute,
		DisableCompression: true,
	}
	base := "http://" + addr
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		if path == "" {
			return nil, errors.New(`"unix:": give the socket's path, unix:PATH`)
		}
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		}
		base = "http://edge-stats"
	} else if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return nil, fmt.Errorf("%q: give unix:PATH or host:port", addr)
	}
	return &edgeTraffic{base: base, client: &http.Client{Transport: tr, Timeout: edgeTrafficTimeout}}, nil
}

// AppTraffic asks the edge for app's figures over windows.
func (e *edgeTraffic) AppTraffic(ctx context.Context, app string, windows ...time.Duration) ([]backend.TrafficWindow, error) {
	if len(windows) == 0 {
		return []backend.TrafficWindow{}, nil
	}
	q := make(url.Values)
	for _, w := range windows {
		v := w.String() // not whole minutes: the edge says so
		if w%time.Minute == 0 {
			v = strconv.FormatInt(int64(w/time.Minute), 10) + "m"
		}
		q.Add("window", v)
	}
	var out []backend.TrafficWindow
	if err := e.get(ctx, "/v1/apps/"+url.PathEscape(app)+"/traffic?"+q.Encode(), &out); err != nil {
		return nil, err
	}
	if len(out) != len(windows) {
		return nil, fmt.Errorf("the edge's stats cannot be read: %d windows answered for %d asked", len(out), len(windows))
	}
	for i := range out {
		out[i].Window = time.Duration(out[i].Minutes) * time.Minute
	}
	return out, nil
}

// AppCertificates asks the edge for the certificate state of app's hosts.
func (e *edgeTraffic) AppCertificates(ctx context.Context, app string) ([]backend.CertificateState, error) {
	var out []backend.CertificateState
	if err := e.get(ctx, "/v1/apps/"+url.PathEscape(app)+"/certificates", &out); err != nil {
		return nil, err
	}
	if out == nil {
		out = []backend.CertificateState{} // the edge's [], or a null
	}
	return out, nil
}

// get reads the JSON answer to GET path into out.
func (e *edgeTraffic) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.base+path, nil)
	if err != nil {
		return err
	}
	res, err := e.client.Do(req)
	if err != nil {
		return fmt.Errorf("the edge's stats cannot be read: %w", err)
	}
	defer res.Body.Close()
	body := io.LimitReader(res.Body, 64<<10)
	if res.StatusCode != http.StatusOK {
		// The edge's refusals are one line of text.
		line, _ := bufio.NewReader(body).ReadString('\n')
		return fmt.Errorf("the edge's stats cannot be read: %s: %s", res.Status, strings.TrimSpace(line))
	}
	if err := json.NewDecoder(body).Decode(out); err != nil {
		return fmt.Errorf("the edge's stats cannot be read: %w", err)
	}
	return nil
}
