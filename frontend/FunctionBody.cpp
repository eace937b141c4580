#include "frontend/FunctionBody.h"

#include "frontend/OnnxTensor.h"
#include "support/Errors.h"

#include "llvm/Support/FormatVariadic.h"

#include <onnx/defs/schema.h>
#include <onnx/shape_inference/attribute_binder.h>

#include <map>

namespace cleave::frontend {

// The body ONNX defines for `call` at `opset`: a fixed one, or one its
// builder makes for the call's attributes and input types. Empty when the
// op has neither.
static llvm::Expected<onnx::FunctionProto>
buildBody(const onnx::OpSchema &schema, const onnx::NodeProto &call,
          int64_t opset, llvm::ArrayRef<const ir::TensorType *> inputTypes) {
  onnx::FunctionProto body;
  if (schema.HasFunction())
    if (const onnx::FunctionProto *f = schema.GetFunction(int(opset), false))
      body = *f;
  if (body.node_size() > 0 || !schema.HasContextDependentFunction())
    return body;
  std::vector<onnx::TypeProto> types(call.input_size());
  for (size_t k = 0; k < types.size() && k < inputTypes.size(); ++k) {
    if (!inputTypes[k])
      continue;
    auto *tensor = types[k].mutable_tensor_type();
    tensor->set_elem_type(dtypeToOnnx(inputTypes[k]->dtype));
    auto *shape = tensor->mutable_shape();
    for (int64_t d : inputTypes[k]->shape)
      shape->add_dim()->set_dim_value(d);
  }
  onnx::FunctionBodyBuildContextImpl context(call, types);
  try {
    if (!schema.BuildContextDependentFunction(context, body, int(opset)))
      return failf("ONNX cannot build the function body of '{0}' for these "
                   "attributes and input types",
                   call.op_type());
  } catch (const std::exception &ex) {
    return failf("ONNX cannot build the function body of '{0}': {1}",
                 call.op_type(), ex.what());
  }
  return body;
}

// Replaces the body's attribute references (`<alpha: float = @alpha>`)
// with the call's values, or the op's defaults where the call gives none
// (ONNX's AttributeBinder drops a reference it cannot resolve, which would
// leave the body's op with its own default instead of the function's).
static void bindAttributes(const onnx::OpSchema &schema,
                           const onnx::NodeProto &call,
                           onnx::FunctionProto &body) {
  std::map<std::string, onnx::AttributeProto> values;
  for (const auto &[name, attr] : schema.attributes())
    if (attr.default_value.type() != onnx::AttributeProto::UNDEFINED)
      values[name] = attr.default_value;
  for (const auto &a : body.attribute_proto())
    values[a.name()] = a;
  for (const auto &a : call.attribute())
    values[a.name()] = a;
  onnx::internal::AttributeMap map;
  for (auto &[name, value] : values) {
    value.set_name(name);
    map[name] = &value;
  }
  onnx::internal::AttributeBinder binder(map);
  binder.VisitFunction(body);
}

llvm::Expected<std::optional<FunctionBody>>
expandFunction(const onnx::NodeProto &call, int64_t opset,
               llvm::ArrayRef<const ir::TensorType *> inputTypes,
               llvm::function_ref<std::string(llvm::StringRef)> freshName) {
  const onnx::OpSchema *schema =
      onnx::OpSchemaRegistry::Schema(call.op_type(), int(opset), "");
  if (!schema)
    return std::nullopt;
  auto body = buildBody(*schema, call, opset, inputTypes);
  if (!body)
    return body.takeError();
  if (body->node_size() == 0)
    return std::nullopt;
  bindAttributes(*schema, call, *body);

  FunctionBody out;
  out.opset = opset;
  for (const auto &imp : body->opset_import())
    if (imp.domain().empty() || imp.domain() == "ai.onnx")
      out.opset = imp.version();
  if (call.input_size() > body->input_size() ||
      call.output_size() > body->output_size())
    return failf("the call has more inputs or outputs than the function body "
                 "of '{0}'",
                 call.op_type());
  // Formal names to actual ones; a value the body defines gets a fresh
  // name, prefixed by the call's name so that errors and dumps show where
  // it came from.
  std::string prefix = !call.name().empty()      ? call.name()
                       : call.output_size() > 0 ? call.output(0)
                                                : call.op_type();
  std::map<std::string, std::string> actual;
  for (int i = 0; i < body->input_size(); ++i)
    actual[body->input(i)] = i < call.input_size() ? call.input(i) : "";
  for (int i = 0; i < body->output_size(); ++i)
    actual[body->output(i)] =
        i < call.output_size() && !call.output(i).empty()
            ? call.output(i)
            : freshName(prefix + "/" + body->output(i));
  for (const onnx::NodeProto &formal : body->node()) {
    onnx::NodeProto n = formal;
    for (std::string &in : *n.mutable_input()) {
      auto it = actual.find(in);
      if (!in.empty() && it != actual.end())
        in = it->second;
    }
    for (std::string &o : *n.mutable_output()) {
      if (o.empty())
        continue;
      auto it = actual.find(o);
      if (it == actual.end())
        it = actual.emplace(o, freshName(prefix + "/" + o)).first;
      o = it->second;
    }
    std::string what = !formal.name().empty() ? formal.name()
                       : formal.output_size() > 0 ? formal.output(0)
                                                  : formal.op_type();
    n.set_name(prefix + "/" + what);
    out.nodes.push_back(std::move(n));
  }
  return out;
}

} // namespace cleave::frontend
