// scratchapp is the smallest real web app a push can ship: a static Go binary on a
// scratch image that serves the files under /www on $PORT. BenchmarkPushToLive
// pushes it, so that a warm push measures bex's own path and not a RUN step's.
package main

import (
	"log"
	"net/http"
	"os"
)

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "5000"
	}
	log.Fatal(http.ListenAndServe(":"+port, http.FileServer(http.Dir("/www"))))
}
