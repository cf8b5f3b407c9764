# A Rack app with no framework: it says which environment it runs in, and that it
# may write into its own tree.
require "rack"

run lambda { |env|
  req = Rack::Request.new(env)
  case req.path
  when "/"
    File.write("tmp-written", "ok")
    [200, { "content-type" => "text/plain" }, ["hello from rack #{Rack.release} in #{ENV["RACK_ENV"]}, wrote #{File.read("tmp-written")}\n"]]
  else
    [404, { "content-type" => "text/plain" }, ["not found\n"]]
  end
}
