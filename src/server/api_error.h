#pragma once
// HTTP boundary errors. Handlers throw ApiError (or let kvserve::Error and
// JSON errors escape); error_response() is the one place that turns any
// exception into a status code and an OpenAI-style error body.
#include <exception>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace kvserve::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string type = "invalid_request_error")
      : std::runtime_error(message), status_(status), param_(std::move(param)), type_(std::move(type)) {}

  int status() const { return status_; }
  const std::string& param() const { return param_; }  // the request field at fault; "" for none
  const std::string& type() const { return type_; }

 private:
  int status_;
  std::string param_;
  std::string type_;
};

// A 400 naming the request field at fault.
inline ApiError invalid(const std::string& param, const std::string& message) { return ApiError(400, message, param); }

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_body(const ApiError& error);

// The status and error a caught exception stands for: ApiError as is, bad
// JSON and kvserve::Error (bad input found deeper down) as 400, anything
// else as 500.
ApiError classify_exception(std::exception_ptr error);

// Response bodies may hold model output cut mid-character (token pieces of
// logprobs); invalid UTF-8 is replaced instead of throwing.
std::string dump_json(const nlohmann::json& value);

}  // namespace kvserve::server
