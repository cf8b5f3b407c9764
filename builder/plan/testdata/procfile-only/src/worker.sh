echo "worker in $PWD"
