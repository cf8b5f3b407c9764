package edge

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// BenchmarkProxy measures requests per second on loopback, kept-alive connections
// and small responses, straight to a backend and through the edge in the same run,
// and reports both and their ratio. The table is static: this is the proxy's cost,
// not the API server's.
func BenchmarkProxy(b *testing.B) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer be.Close()
	table := staticTable("localhost", []appv1.App{app("bench")}, []discoveryv1.EndpointSlice{
		slice("bench", discoveryv1.AddressTypeFQDN, int32(port(b, be.Listener.Addr())), ep(nil, "127.0.0.1")),
	})
	p, err := NewProxy(Config{}, table, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		b.Fatal(err)
	}
	edge := httptest.NewUnstartedServer(p)
	p.ConfigureServer(edge.Config)
	edge.Start()
	defer edge.Close()

	const workers = 8
	run := func(url string) float64 {
		c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
		defer c.CloseIdleConnections()
		var left atomic.Int64
		left.Store(int64(b.N))
		var wg sync.WaitGroup
		start := time.Now()
		for range workers {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					req, _ := http.NewRequest("GET", url, nil)
					req.Host = "bench.localhost"
					res, err := c.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode != 200 {
						b.Errorf("status %d", res.StatusCode)
						return
					}
				}
			})
		}
		wg.Wait()
		return float64(b.N) / time.Since(start).Seconds()
	}
	b.ResetTimer()
	direct := run(be.URL)
	through := run(edge.URL)
	b.StopTimer()
	b.ReportMetric(direct, "direct-req/s")
	b.ReportMetric(through, "edge-req/s")
	b.ReportMetric(through/direct, "edge/direct")
}
