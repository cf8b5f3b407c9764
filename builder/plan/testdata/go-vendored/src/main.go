// A web app whose one module dependency is vendored (go mod vendor): the build
// downloads nothing. It answers with a fresh UUID on $PORT.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/google/uuid"
)

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from vendored go as uid %d, request %s\n", os.Getuid(), uuid.NewString())
	})
	log.Fatal(http.ListenAndServe(":"+port, nil))
}
