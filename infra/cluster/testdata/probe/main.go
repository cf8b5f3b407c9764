// Command probe is a tenant's app that reports what its pod can reach: it serves
// HTTP on $PORT like any app, and each request of the isolation test
// (infra/cluster/isolation_test.go) makes it try one kind of connection from
// inside the pod and answer with what happened, as JSON. It holds no
// credentials: what it reaches, any tenant reaches (a token the test hands it,
// bearer=, is the control that the same path works for who holds one).
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	bkclient "github.com/moby/buildkit/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

const timeout = 3 * time.Second

// result is one attempt.
type result struct {
	Target string `json:"target"`
	// Connected: a TCP connection was made.
	Connected bool   `json:"connected"`
	Status    int    `json:"status,omitempty"`
	Body      string `json:"body,omitempty"`
	Err       string `json:"err,omitempty"`
	// Found: the body contains the request's find=S.
	Found bool `json:"found,omitempty"`
}

func main() {
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "probe") })
	// /tcp?addr=H:P&addr=...: a TCP connection to each, at once.
	mux.HandleFunc("/tcp", func(w http.ResponseWriter, r *http.Request) {
		reply(w, dialAll(r.URL.Query()["addr"]))
	})
	// /http?url=U&method=M (and /https, which checks no certificate): a request
	// with no credentials but what the test hands it: header=K:V (repeated)
	// adds headers, which a tenant writes as it likes (forged X-Forwarded-For,
	// a guessed bearer token); bearer=TOKEN the header Authorization: Bearer
	// TOKEN (a token the test made, for the control of a check that demands
	// one); host=H sends Host H (and, over TLS, SNI H) to the URL's address, as
	// a client resolving H there would; find=S says whether the whole body, not
	// only its start, contains S.
	for _, scheme := range []string{"http", "https"} {
		mux.HandleFunc("/"+scheme, func(w http.ResponseWriter, r *http.Request) {
			q := r.URL.Query()
			reply(w, request(q.Get("method"), q.Get("url"), q.Get("host"), q["header"], q.Get("bearer"), q.Get("find")))
		})
	}
	// /buildkit?addr=tcp://H:P&tls=none|nocert: BuildKit's own client lists the
	// workers, without TLS or with TLS and no client certificate (the server's
	// own is not checked: the tenant has no CA to check it with).
	mux.HandleFunc("/buildkit", func(w http.ResponseWriter, r *http.Request) {
		addr := r.URL.Query().Get("addr")
		res := result{Target: addr}
		if c, err := net.DialTimeout("tcp", strings.TrimPrefix(addr, "tcp://"), timeout); err == nil {
			res.Connected = true
			c.Close()
		}
		var opts []bkclient.ClientOpt
		if r.URL.Query().Get("tls") == "nocert" {
			// Given last, these credentials replace the client's default.
			opts = append(opts, bkclient.WithGRPCDialOption(grpc.WithTransportCredentials(
				credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))))
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*timeout)
		defer cancel()
		c, err := bkclient.New(ctx, addr, opts...)
		if err == nil {
			var ws []*bkclient.WorkerInfo
			ws, err = c.ListWorkers(ctx)
			c.Close()
			if err == nil {
				res.Status = 200
				res.Body = fmt.Sprintf("%d workers", len(ws))
			}
		}
		if err != nil {
			res.Err = err.Error()
		}
		reply(w, res)
	})
	// /token: whether Kubernetes gave this pod a ServiceAccount token.
	mux.HandleFunc("/token", func(w http.ResponseWriter, _ *http.Request) {
		res := result{Target: "/var/run/secrets/kubernetes.io/serviceaccount/token"}
		if b, err := os.ReadFile(res.Target); err == nil {
			res.Connected, res.Body = true, fmt.Sprintf("%d bytes", len(b))
		} else {
			res.Err = err.Error()
		}
		reply(w, res)
	})
	srv := &http.Server{Addr: ":" + os.Getenv("PORT"), Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func request(method, url, host string, headers []string, bearer, find string) result {
	res := result{Target: method + " " + url}
	if method == "" {
		method = http.MethodGet
	}
	hc := &http.Client{Timeout: 2 * timeout, Transport: &http.Transport{
		// The tenant has no CA: it only sees what answers.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: host},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, addr)
			if err == nil {
				res.Connected = true
			}
			return c, err
		},
	}}
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	if host != "" {
		req.Host = host
	}
	for _, h := range headers {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			res.Err = fmt.Sprintf("header %q: want K:V", h)
			return res
		}
		req.Header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	resp, err := hc.Do(req)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	res.Status, res.Body = resp.StatusCode, string(body[:min(len(body), 300)])
	if find != "" {
		res.Found = strings.Contains(string(body), find)
	}
	return res
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
