// The shop's web server, in the cmd/server layout: the module's root package is the
// library, the command is under cmd/. It answers with the library's greeting on $PORT.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"

	"example.com/shop"
)

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s from cmd/server as uid %d\n", shop.Greeting(), os.Getuid())
	})
	log.Fatal(http.ListenAndServe(":"+port, nil))
}
