#!/bin/sh
# CGI: busybox httpd runs this with its own environment, which is the release's.
printf 'Content-Type: text/plain\r\n\r\n'
echo "${GREETING:-hello} from hello-shell"
