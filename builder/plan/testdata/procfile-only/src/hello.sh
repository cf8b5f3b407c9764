# $$ is 1 when the Dockerfile's CMD exec'd this script: it gets the stop signal.
echo "hello from $PORT as $(id -u), pid $$: $(cat greeting.txt)"
