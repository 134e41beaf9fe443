#include "server/api_error.h"

#include "core/error.h"

namespace kvserve::server {

nlohmann::json error_body(const ApiError& error) {
  nlohmann::json param = error.param().empty() ? nlohmann::json(nullptr) : nlohmann::json(error.param());
  return {{"error", {{"message", error.what()}, {"type", error.type()}, {"param", param}, {"code", error.status()}}}};
}

ApiError classify_exception(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const ApiError& e) {
    return e;
  } catch (const nlohmann::json::parse_error& e) {
    return ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  } catch (const nlohmann::json::exception& e) {
    return ApiError(400, std::string("a request field has the wrong type: ") + e.what());
  } catch (const Error& e) {
    return ApiError(400, e.what());
  } catch (const std::exception& e) {
    return ApiError(500, std::string("internal error: ") + e.what(), {}, "server_error");
  } catch (...) {
    return ApiError(500, "internal error", {}, "server_error");
  }
}

std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvserve::server
